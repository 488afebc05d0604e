/* admission.p4: is the packet for the aggregation service, and from an admitted worker?
 *
 * Stage 1 (switch_emulator/admission.py does the same):
 *   local_address: the IPv4 destination is one of the switch's service addresses -> meta.to_switch.
 *                  Other homagg-looking packets (e.g. results crossing a leaf switch) are forwarded.
 *   header check:  version, op, no RESULT flag, exactly P4_WORDS words; else DROP_BAD_HEADER.
 *   admission:     (src ip, src udp port, job_id, worker_id) -> the job's configuration
 *                  (slot range, worker count, result multicast group, port towards the worker);
 *                  no entry -> DROP_UNKNOWN_SOURCE.  A direct counter counts each worker's packets.
 */
#ifndef HOMAGG_ADMISSION_P4
#define HOMAGG_ADMISSION_P4

control Admission(inout headers_t hdr, inout metadata_t meta) {
    direct_counter(CounterType.packets_and_bytes) worker_packets;

    action service_address() {
        meta.to_switch = true;
    }

    table local_address {
        key = { hdr.ipv4.dst_addr : exact; }
        actions = { service_address; NoAction; }
        default_action = NoAction();
        size = 16;
    }

    action admit(bit<16> slot_base, bit<16> slot_count, bit<8> num_workers,
                 bit<16> mcast_grp, bit<9> worker_port) {
        worker_packets.count();
        meta.slot_base = slot_base;
        meta.slot_count = slot_count;
        meta.num_workers = num_workers;
        meta.mcast_grp = mcast_grp;
        meta.worker_port = worker_port;
    }

    action reject() {
        worker_packets.count();
        meta.drop_reason = DROP_UNKNOWN_SOURCE;
    }

    table admission {
        key = {
            hdr.ipv4.src_addr     : exact;
            hdr.udp.src_port      : exact;
            hdr.homagg.job_id     : exact;
            hdr.homagg.worker_id  : exact;
        }
        actions = { admit; @defaultonly reject; }
        const default_action = reject();
        counters = worker_packets;
        size = ADMISSION_ENTRIES;
    }

    apply {
        if (local_address.apply().hit) {
            if (hdr.homagg.version != HOMAGG_VERSION || hdr.homagg.op > OP_MAX
                    || (hdr.homagg.flags & FLAG_RESULT) != 0 || !hdr.payload.isValid()) {
                meta.drop_reason = DROP_BAD_HEADER;
            } else {
                admission.apply();
            }
        }
    }
}

#endif
