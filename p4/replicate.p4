/* replicate.p4: send a result to the job's workers (ingress decision + egress rewrite).
 *
 * Stage 6 (switch_emulator/replication.py).  Ingress (Replicate), by verdict:
 *   FIRST/ADD that completed the cell -> multicast to the job's group (one replica per registered
 *                                        worker, replication id = worker_id, in worker order);
 *                                        at a child (trees, tree.p4): up to the parent (TREE_UP)
 *   FIRST/ADD, cell not complete      -> absorbed (DROP_CONSUMED)
 *   ANSWER                            -> unicast the stored result back to the sender; at a child
 *                                        whose result has not come down (down = 0): the cell's
 *                                        words up again, FLAG_RETRANSMIT (TREE_RETRANSMIT_UP)
 *   a result from the parent          -> multicast to the job's group, as a completion (TREE_RESULT_DOWN)
 *   DUPLICATE / STALE / CONFLICT      -> dropped with that reason; earlier stages' drops too
 *   Every drop is counted in drop_reasons[reason], every tree event in tree_events[event].
 *
 * Egress (HomaggEgress): an up packet leaves as ingress rewrote it; every other copy is rewritten for its destination worker from result_rewrite
 *   (job_id, worker) -> switch MAC/IP, worker MAC/IP/UDP port.  Results leave with
 *   flags = FLAG_RESULT, reserved = 0, worker_id = the destination worker, the job token as admitted (the
 *   packet that completed or asked for the cell passed admission), UDP source port HOMAGG_UDP_PORT,
 *   UDP checksum 0, IPv4 identification 0, DF, TTL RESULT_TTL (checksum recomputed in deparser.p4).
 *   A copy without a rewrite entry is dropped.  Forwarded frames never leave through their ingress
 *   port (flooding prunes it; L2 switches do not hairpin).
 */
#ifndef HOMAGG_REPLICATE_P4
#define HOMAGG_REPLICATE_P4

control Replicate(inout headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    counter(DROP_REASONS, CounterType.packets) drop_reasons;
    counter(TREE_EVENTS, CounterType.packets) tree_events;
    SendUp() send_up;

    apply {
        bool go_up = false;
        bit<8> up_flags = 0;
        if (meta.drop_reason == DROP_NONE) {
            if (meta.from_parent) {
                standard_metadata.mcast_grp = meta.mcast_grp;
                tree_events.count(TREE_RESULT_DOWN);
            } else if (meta.verdict == VERDICT_FIRST || meta.verdict == VERDICT_ADD) {
                if (!meta.complete) {
                    meta.drop_reason = DROP_CONSUMED;
                } else if (meta.is_child) {
                    go_up = true;
                    tree_events.count(TREE_UP);
                } else {
                    standard_metadata.mcast_grp = meta.mcast_grp;
                }
            } else if (meta.verdict == VERDICT_ANSWER) {
                if (meta.is_child && !meta.down) {
                    go_up = true;
                    up_flags = FLAG_RETRANSMIT;
                    tree_events.count(TREE_RETRANSMIT_UP);
                } else {
                    meta.unicast = true;
                    standard_metadata.egress_spec = meta.worker_port;
                }
            } else if (meta.verdict == VERDICT_DUPLICATE) {
                meta.drop_reason = DROP_DUPLICATE;
            } else if (meta.verdict == VERDICT_STALE) {
                meta.drop_reason = DROP_STALE;
            } else {
                meta.drop_reason = DROP_CONFLICT;
            }
        }
        if (go_up) {
            send_up.apply(hdr, meta, standard_metadata, up_flags);
        }
        if (meta.drop_reason != DROP_NONE) {
            drop_reasons.count(meta.drop_reason);
            mark_to_drop(standard_metadata);
        }
    }
}

control HomaggEgress(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {
    direct_counter(CounterType.packets_and_bytes) results_sent;

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
        mark_to_drop(standard_metadata);
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
        if (meta.to_switch) {
            if (meta.up) {
                return;  /* an up packet to the parent: rewritten in ingress (tree.p4) */
            }
            if (!meta.unicast) {
                hdr.homagg.worker_id = (bit<8>) standard_metadata.egress_rid;
            }
            result_rewrite.apply();
        } else if (standard_metadata.egress_port == standard_metadata.ingress_port) {
            mark_to_drop(standard_metadata);
        }
    }
}

#endif
