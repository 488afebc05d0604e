/* admission.p4: is the packet for the aggregation service, and from an admitted worker?
 *
 * Stage 1 (switch_emulator/pipeline.py parser checks + switch_emulator/admission.py):
 *   Applied to UDP datagrams for port HOMAGG_UDP_PORT (the port the emulator listens on).
 *   local_address: the IPv4 destination is one of the switch's service addresses -> meta.to_switch.
 *                  Other homagg-looking packets (e.g. results crossing a leaf switch) are forwarded.
 *   header checks, in the emulator's order: a whole homagg header (drop_short), version, op,
 *                  word_count >= 1 and equal to what the UDP length says and every word present
 *                  (drop_length).
 *   results:       a packet with the RESULT flag is a result from a job's parent (trees,
 *                  tree.p4) if parent_result knows (src ip, src udp port, job_id): the job's
 *                  configuration (from_parent); else drop_result_flag.  Then, as for a member:
 *                  drop_token, drop_word_count.
 *   admission:     source (ip, udp port) -> (job, worker) and the job's configuration; no entry:
 *                  drop_unknown_source; header job/worker differ: drop_admission_mismatch; header
 *                  token is not the one the controller installed with the job: drop_token (a
 *                  spoofed source); more words than the job was admitted with: drop_word_count.  A direct counter counts each
 *                  admitted source's packets.
 */
#ifndef HOMAGG_ADMISSION_P4
#define HOMAGG_ADMISSION_P4

control Admission(inout headers_t hdr, inout metadata_t meta, in error parser_error) {
    direct_counter(CounterType.packets_and_bytes) source_packets;

    action service_address() {
        meta.to_switch = true;
    }

    table local_address {
        key = { hdr.ipv4.dst_addr : exact; }
        actions = { service_address; NoAction; }
        default_action = NoAction();
        size = 16;
    }

    action admit(bit<16> job_id, bit<8> worker_id, bit<16> slot_base, bit<16> n_slots,
                 bit<8> world_size, bit<16> words_per_packet, bit<16> mcast_grp, bit<9> worker_port,
                 bit<32> epoch, bit<32> token) {
        source_packets.count();
        meta.job_id = job_id;
        meta.worker_id = worker_id;
        meta.slot_base = slot_base;
        meta.n_slots = n_slots;
        meta.world_size = world_size;
        meta.words_per_packet = words_per_packet;
        meta.mcast_grp = mcast_grp;
        meta.worker_port = worker_port;
        meta.epoch = epoch;
        meta.token = token;
    }

    action unknown_source() {
        source_packets.count();
        meta.drop_reason = DROP_UNKNOWN_SOURCE;
    }

    action from_parent(bit<16> slot_base, bit<16> n_slots, bit<8> world_size, bit<16> words_per_packet,
                       bit<16> mcast_grp, bit<32> epoch, bit<32> token) {
        meta.from_parent = true;
        meta.job_id = hdr.homagg.job_id;
        meta.slot_base = slot_base;
        meta.n_slots = n_slots;
        meta.world_size = world_size;
        meta.words_per_packet = words_per_packet;
        meta.mcast_grp = mcast_grp;
        meta.epoch = epoch;
        meta.token = token;
    }

    action result_flag() {
        meta.drop_reason = DROP_RESULT_FLAG;
    }

    /* trees: the jobs for which this switch is a child, by the parent's data address (the
     * emulator's admission.by_parent); installed by the controller with the job's admit entries */
    table parent_result {
        key = {
            hdr.ipv4.src_addr   : exact;
            hdr.udp.src_port    : exact;
            hdr.homagg.job_id   : exact;
        }
        actions = { from_parent; @defaultonly result_flag; }
        const default_action = result_flag();
        size = ADMISSION_ENTRIES;
    }

    table admission {
        key = {
            hdr.ipv4.src_addr : exact;
            hdr.udp.src_port  : exact;
        }
        actions = { admit; @defaultonly unknown_source; }
        const default_action = unknown_source();
        counters = source_packets;
        size = ADMISSION_ENTRIES;
    }

    apply {
        if (local_address.apply().hit) {
            if (!hdr.homagg.isValid() || hdr.udp.length < 8 + HEADER_LEN) {
                /* (the second test: Ethernet padding of a minimum-size frame can complete a header) */
                meta.drop_reason = DROP_SHORT;
            } else if (hdr.homagg.version != HOMAGG_VERSION) {
                meta.drop_reason = DROP_VERSION;
            } else if (hdr.homagg.op > OP_MAX) {
                meta.drop_reason = DROP_OP;
            } else if (hdr.homagg.word_count == 0 || parser_error != error.NoError
                       || (bit<32>) hdr.udp.length != 8 + (bit<32>) HEADER_LEN + ((bit<32>) hdr.homagg.word_count << 2)
                       || hdr.ipv4.total_len != 20 + hdr.udp.length) {
                meta.drop_reason = DROP_LENGTH;
            } else {
                if ((hdr.homagg.flags & FLAG_RESULT) != 0) {
                    parent_result.apply();
                } else {
                    admission.apply();
                    if (meta.drop_reason == DROP_NONE
                        && (meta.job_id != hdr.homagg.job_id || meta.worker_id != hdr.homagg.worker_id)) {
                        meta.drop_reason = DROP_ADMISSION_MISMATCH;
                    }
                }
                if (meta.drop_reason == DROP_NONE) {
                    if (meta.token != hdr.homagg.token) {
                        meta.drop_reason = DROP_TOKEN;
                    } else if (hdr.homagg.word_count > meta.words_per_packet) {
                        /* the controller admits words_per_packet <= P4_WORDS: this also drops the
                         * word counts beyond P4_WORDS, whose words the parser left unparsed */
                        meta.drop_reason = DROP_WORD_COUNT;
                    }
                }
            }
        }
    }
}

#endif
