/* replicate.p4: send a result to the job's workers (ingress decision + egress rewrite).
 *
 * As ../replicate.p4 (switch_emulator/replication.py).  Ingress (Replicate), by verdict:
 *   FIRST/ADD that completed the cell -> root: multicast group mcast_grp_a = the job's group (one
 *                                        replica per worker, rid = worker_id); child (trees): up,
 *                                        unicast to the parent's port (tree_events[TREE_UP])
 *   FIRST/ADD, cell not complete      -> absorbed (DROP_CONSUMED)
 *   ANSWER                            -> unicast to the sender's port; at a child whose cell's down
 *                                        bit is 0: up again, flagged (TREE_RETRANSMIT_UP)
 *   RESULT_DOWN, taken (first = 1)    -> trees: multicast to the job's group (TREE_RESULT_DOWN)
 *   RESULT_DOWN not taken, STALE_RESULT -> dropped as DROP_STALE_RESULT
 *   DUPLICATE / STALE / CONFLICT      -> dropped with that reason; earlier stages' drops too
 *   Every drop is counted in drop_reasons[reason].  The bridged header tells egress what it got.
 * Egress (ResultRewrite): result_rewrite (job_id, worker_id) -> addresses, as the v1model program;
 * a copy without an entry is dropped; a forwarded frame never leaves through its ingress port.
 * Up (trees, BRIDGE_UP / BRIDGE_UP_RETRANSMIT): parent_rewrite (job_id) -> from the switch's data
 * address to the parent's, worker_id = child_id, flags 0 / FLAG_RETRANSMIT; the words are the
 * cell's (the Word stages returned them into the packet); no entry: dropped.
 */
#ifndef HOMAGG_TOFINO_REPLICATE_P4
#define HOMAGG_TOFINO_REPLICATE_P4

control Replicate(inout tofino_headers_t hdr, inout ig_meta_t meta,
                  inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                  inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    Counter<bit<64>, bit<8>>(DROP_REASONS, CounterType_t.PACKETS) drop_reasons;
    Counter<bit<64>, bit<8>>(TREE_EVENTS, CounterType_t.PACKETS) tree_events;

    action up(bit<8> kind, bit<8> event) {
        ig_tm_md.ucast_egress_port = meta.parent_port;
        hdr.bridge.kind = kind;
        meta.count_tree = 1;
        meta.tree_event = event;
    }

    apply {
        if (meta.drop_reason == (bit<8>) DROP_NONE) {
            if (meta.verdict == VERDICT_FIRST || meta.verdict == VERDICT_ADD) {
                if (!meta.complete) {
                    meta.drop_reason = (bit<8>) DROP_CONSUMED;
                } else if (meta.child == 1) {
                    up(BRIDGE_UP, (bit<8>) TREE_UP);
                } else {
                    ig_tm_md.mcast_grp_a = meta.mcast_grp;
                    hdr.bridge.kind = BRIDGE_RESULT;
                }
            } else if (meta.verdict == VERDICT_ANSWER) {
                if (meta.child == 1 && meta.down == 0) {
                    up(BRIDGE_UP_RETRANSMIT, (bit<8>) TREE_RETRANSMIT_UP);
                } else {
                    ig_tm_md.ucast_egress_port = meta.worker_port;
                    hdr.bridge.kind = BRIDGE_ANSWER;
                }
            } else if (meta.verdict == VERDICT_RESULT_DOWN && meta.first == 1) {
                ig_tm_md.mcast_grp_a = meta.down_grp;
                hdr.bridge.kind = BRIDGE_RESULT;
                meta.count_tree = 1;
                meta.tree_event = (bit<8>) TREE_RESULT_DOWN;
            } else if (meta.verdict == VERDICT_RESULT_DOWN || meta.verdict == VERDICT_STALE_RESULT) {
                meta.drop_reason = (bit<8>) DROP_STALE_RESULT;
            } else if (meta.verdict == VERDICT_DUPLICATE) {
                meta.drop_reason = (bit<8>) DROP_DUPLICATE;
            } else if (meta.verdict == VERDICT_STALE) {
                meta.drop_reason = (bit<8>) DROP_STALE;
            } else {
                meta.drop_reason = (bit<8>) DROP_CONFLICT;
            }
        }
        if (meta.drop_reason != (bit<8>) DROP_NONE) {
            drop_reasons.count(meta.drop_reason);
            ig_dprsr_md.drop_ctl = 1;
        }
        if (meta.count_tree == 1) {
            tree_events.count(meta.tree_event);
        }
    }
}

control ResultRewrite(inout tofino_headers_t hdr, in egress_intrinsic_metadata_t eg_intr_md,
                      inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    DirectCounter<bit<64>>(CounterType_t.PACKETS_AND_BYTES) results_sent;

    action to_worker(bit<48> switch_mac, bit<32> switch_ip,
                     bit<48> worker_mac, bit<32> worker_ip, bit<16> worker_port) {
        results_sent.count();
        hdr.ethernet.dst_addr = worker_mac;
        hdr.ethernet.src_addr = switch_mac;
        hdr.ipv4.diffserv = 0;
        hdr.ipv4.identification = 0;
        hdr.ipv4.flags = RESULT_IP_FLAGS;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.ipv4.src_addr = switch_ip;
        hdr.ipv4.dst_addr = worker_ip;
        hdr.udp.src_port = HOMAGG_UDP_PORT;
        hdr.udp.dst_port = worker_port;
        hdr.udp.checksum = 0;
        hdr.homagg.flags = FLAG_RESULT;
        hdr.homagg.reserved = 0;
    }

    action drop_copy() {
        results_sent.count();
        eg_dprsr_md.drop_ctl = 1;
    }

    DirectCounter<bit<64>>(CounterType_t.PACKETS_AND_BYTES) up_sent;

    /* trees: a use sent up to the job's parent, from this switch's data address, as worker child_id */
    action to_parent(bit<48> switch_mac, bit<32> switch_ip, bit<48> parent_mac, bit<32> parent_ip,
                     bit<16> parent_port, bit<8> child_id) {
        up_sent.count();
        hdr.ethernet.dst_addr = parent_mac;
        hdr.ethernet.src_addr = switch_mac;
        hdr.ipv4.diffserv = 0;
        hdr.ipv4.identification = 0;
        hdr.ipv4.flags = RESULT_IP_FLAGS;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.ipv4.src_addr = switch_ip;
        hdr.ipv4.dst_addr = parent_ip;
        hdr.udp.src_port = HOMAGG_UDP_PORT;
        hdr.udp.dst_port = parent_port;
        hdr.udp.checksum = 0;
        hdr.homagg.worker_id = child_id;
        hdr.homagg.reserved = 0;
    }

    action drop_up() {
        up_sent.count();
        eg_dprsr_md.drop_ctl = 1;
    }

    table parent_rewrite {
        key = { hdr.homagg.job_id : exact; }
        actions = { to_parent; @defaultonly drop_up; }
        const default_action = drop_up();
        counters = up_sent;
        size = JOB_ENTRIES;
    }

    table result_rewrite {
        key = {
            hdr.homagg.job_id    : exact;
            hdr.homagg.worker_id : exact;   /* already set to the destination worker */
        }
        actions = { to_worker; @defaultonly drop_copy; }
        const default_action = drop_copy();
        counters = results_sent;
        size = ADMISSION_ENTRIES;
    }

    apply {
        if (hdr.bridge.kind == BRIDGE_FORWARD) {
            if (eg_intr_md.egress_port == hdr.bridge.ingress_port) {
                eg_dprsr_md.drop_ctl = 1;
            }
        } else if (hdr.bridge.kind == BRIDGE_UP || hdr.bridge.kind == BRIDGE_UP_RETRANSMIT) {
            parent_rewrite.apply();
            if (hdr.bridge.kind == BRIDGE_UP) {
                hdr.homagg.flags = 0;
            } else {
                hdr.homagg.flags = FLAG_RETRANSMIT;
            }
        } else {
            if (hdr.bridge.kind == BRIDGE_RESULT) {
                hdr.homagg.worker_id = eg_intr_md.egress_rid[7:0];
            }
            result_rewrite.apply();
        }
        hdr.bridge.setInvalid();
    }
}

#endif
