/* replicate.p4: send a result to the job's workers (ingress decision + egress rewrite).
 *
 * As ../replicate.p4 (switch_emulator/replication.py).  Ingress (Replicate), by verdict:
 *   FIRST/ADD that completed the cell -> multicast group mcast_grp_a = the job's group (one replica
 *                                        per worker, rid = worker_id)
 *   FIRST/ADD, cell not complete      -> absorbed (DROP_CONSUMED)
 *   ANSWER                            -> unicast to the sender's port
 *   DUPLICATE / STALE / CONFLICT      -> dropped with that reason; earlier stages' drops too
 *   Every drop is counted in drop_reasons[reason].  The bridged header tells egress what it got.
 * Egress (ResultRewrite): result_rewrite (job_id, worker_id) -> addresses, as the v1model program;
 * a copy without an entry is dropped; a forwarded frame never leaves through its ingress port.
 */
#ifndef HOMAGG_TOFINO_REPLICATE_P4
#define HOMAGG_TOFINO_REPLICATE_P4

control Replicate(inout tofino_headers_t hdr, inout ig_meta_t meta,
                  inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                  inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    Counter<bit<64>, bit<8>>(DROP_REASONS, CounterType_t.PACKETS) drop_reasons;

    apply {
        if (meta.drop_reason == (bit<8>) DROP_NONE) {
            if (meta.verdict == VERDICT_FIRST || meta.verdict == VERDICT_ADD) {
                if (meta.complete) {
                    ig_tm_md.mcast_grp_a = meta.mcast_grp;
                    hdr.bridge.kind = BRIDGE_RESULT;
                } else {
                    meta.drop_reason = (bit<8>) DROP_CONSUMED;
                }
            } else if (meta.verdict == VERDICT_ANSWER) {
                ig_tm_md.ucast_egress_port = meta.worker_port;
                hdr.bridge.kind = BRIDGE_ANSWER;
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
