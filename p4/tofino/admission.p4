/* admission.p4: is the packet for the aggregation service, and from an admitted worker?
 *
 * The v1model program's checks (../admission.p4, switch_emulator/admission.py), rearranged so
 * that every lookup runs in the first stage and the verdict on them costs no stage of its own:
 *   local_address  ipv4 destination is a service address -> meta.to_switch
 *   admission      (src ip, src port) -> the job's parameters (drop_unknown_source on a miss)
 *   admitted_job   (src ip, src port, job_id, worker_id) hit: the header's job and worker are the
 *                  source's (else drop_admission_mismatch); gives others, the job's workers but
 *                  this one (worker_bitmap.p4 marks with it)
 *   admitted_token (src ip, src port, job_id, worker_id, token) hit: and so is the token (else drop_token)
 *   from_parent    trees: (src ip, src port, job_id) hit: the source is the job's parent, whose
 *                  results (FLAG_RESULT) come down here (else drop_result_flag); gives the job's group
 *   parent_token   trees: (src ip, src port, job_id, token) hit: and the token is the job's (else drop_token)
 *   word_limit     (job_id, word_count range 1 .. words_per_packet) hit (else drop_word_count)
 *   slot_range     (job_id, slot range slot_base .. slot_base + n_slots - 1) hit (else drop_slot_range)
 *   lengths        const: (word_count, udp length, ipv4 total length) consistent (else drop_length)
 *   worker_bit     const: worker_id -> 1 << worker_id (Tofino's ALUs shift by constants only)
 * worker_bitmap.p4's table turns these hits and the header fields into the drop reason, in the
 * v1model program's order, and marks the cell for the packets that pass.  offset_max: the offset
 * 0xFFFFFFFF, which use_key.p4 uses for a poisoned use and the verdict never accepts.
 * No epoch (v1model: cells of an earlier admission read as zero): the BF Runtime controller clears
 * a job's cells when it admits it (homagg/p4/bfrt.py).
 */
#ifndef HOMAGG_TOFINO_ADMISSION_P4
#define HOMAGG_TOFINO_ADMISSION_P4

#define LENGTH_ENTRY(NN, I, N) (N, 8 + HEADER_LEN + 4 * N, 20 + 8 + HEADER_LEN + 4 * N) : lengths_consistent();

control Admission(inout tofino_headers_t hdr, inout ig_meta_t meta) {
    /* the use key and the cell index each written whole by an identity hash (moves of several
     * header fields into one container take a stage each: measured), in different tables (one
     * table's action has 32 bits of hash immediate) */
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) use_key_of;
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) cell_of;

    DirectCounter<bit<64>>(CounterType_t.PACKETS_AND_BYTES) source_packets;

    action service_address() { meta.to_switch = true; }

    table local_address {
        key = { hdr.ipv4.dst_addr : exact; }
        actions = { service_address; NoAction; }
        default_action = NoAction();
        size = 16;
    }

    /* child = 1 when the job has a parent here (trees: complete uses go up through parent_port) */
    action admit(bit<8> world_size, bit<16> mcast_grp, PortId_t worker_port, bit<1> child,
                 PortId_t parent_port) {
        source_packets.count();
        meta.source_known = 1;
        meta.world_size = world_size;
        meta.mcast_grp = mcast_grp;
        meta.worker_port = worker_port;
        meta.child = child;
        meta.parent_port = parent_port;
    }

    action unknown_source() {
        source_packets.count();
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

    action job_consistent(bit<32> others) {
        meta.job_ok = 1;
        meta.others = others;
    }

    table admitted_job {
        key = {
            hdr.ipv4.src_addr    : exact;
            hdr.udp.src_port     : exact;
            hdr.homagg.job_id    : exact;
            hdr.homagg.worker_id : exact;
        }
        actions = { job_consistent; @defaultonly NoAction; }
        const default_action = NoAction();
        size = ADMISSION_ENTRIES;
    }

    action token_consistent() { meta.token_ok = 1; }

    table admitted_token {
        key = {
            hdr.ipv4.src_addr    : exact;
            hdr.udp.src_port     : exact;
            hdr.homagg.job_id    : exact;
            hdr.homagg.worker_id : exact;
            hdr.homagg.token     : exact;
        }
        actions = { token_consistent; @defaultonly NoAction; }
        const default_action = NoAction();
        size = ADMISSION_ENTRIES;
    }

    /* trees (docs/trees.md): a result from the job's parent; down_grp = the job's group (the
     * members of this switch), to which a result taken here is multicast */
    action parent_result(bit<16> down_grp) {
        meta.parent_known = 1;
        meta.down_grp = down_grp;
    }

    table from_parent {
        key = {
            hdr.ipv4.src_addr : exact;
            hdr.udp.src_port  : exact;
            hdr.homagg.job_id : exact;
        }
        actions = { parent_result; @defaultonly NoAction; }
        const default_action = NoAction();
        size = JOB_ENTRIES;
    }

    action parent_token_consistent() { meta.parent_token_ok = 1; }

    table parent_token {
        key = {
            hdr.ipv4.src_addr : exact;
            hdr.udp.src_port  : exact;
            hdr.homagg.job_id : exact;
            hdr.homagg.token  : exact;
        }
        actions = { parent_token_consistent; @defaultonly NoAction; }
        const default_action = NoAction();
        size = JOB_ENTRIES;
    }

    action words_allowed() { meta.words_ok = 1; }

    table word_limit {
        key = {
            hdr.homagg.job_id     : exact;
            hdr.homagg.word_count : range;
        }
        actions = { words_allowed; @defaultonly NoAction; }
        const default_action = NoAction();
        size = JOB_ENTRIES;
    }

    action slot_in_range() {
        meta.in_range = 1;
        meta.cell = cell_of.get({hdr.homagg.slot, hdr.homagg.bank});   /* 2 * slot + bank */
    }

    table slot_range {
        key = {
            hdr.homagg.job_id : exact;
            hdr.homagg.slot   : range;
        }
        actions = { slot_in_range; @defaultonly NoAction; }
        const default_action = NoAction();
        size = JOB_ENTRIES;
    }

    action lengths_consistent() { meta.length_ok = 1; }

    /* udp.length == 8 + HEADER_LEN + 4 * word_count and ipv4.total_len == 20 + udp.length */
    table lengths {
        key = {
            hdr.homagg.word_count : exact;
            hdr.udp.length        : exact;
            hdr.ipv4.total_len    : exact;
        }
        actions = { lengths_consistent; @defaultonly NoAction; }
        const default_action = NoAction();
        size = 32;
        const entries = {
            FOR_EACH_WORD(LENGTH_ENTRY)   /* every count the wire allows, 1 .. P4_WORDS */
        }
    }

    action set_mine(bit<32> mine) { meta.mine = mine; }

    table worker_bit {
        key = { hdr.homagg.worker_id : exact; }
        actions = { set_mine; @defaultonly NoAction; }
        const default_action = NoAction();
        size = 32;
        const entries = {
            0 : set_mine(32w1 << 0);    1 : set_mine(32w1 << 1);    2 : set_mine(32w1 << 2);
            3 : set_mine(32w1 << 3);    4 : set_mine(32w1 << 4);    5 : set_mine(32w1 << 5);
            6 : set_mine(32w1 << 6);    7 : set_mine(32w1 << 7);    8 : set_mine(32w1 << 8);
            9 : set_mine(32w1 << 9);    10 : set_mine(32w1 << 10);  11 : set_mine(32w1 << 11);
            12 : set_mine(32w1 << 12);  13 : set_mine(32w1 << 13);  14 : set_mine(32w1 << 14);
            15 : set_mine(32w1 << 15);  16 : set_mine(32w1 << 16);  17 : set_mine(32w1 << 17);
            18 : set_mine(32w1 << 18);  19 : set_mine(32w1 << 19);  20 : set_mine(32w1 << 20);
            21 : set_mine(32w1 << 21);  22 : set_mine(32w1 << 22);  23 : set_mine(32w1 << 23);
            24 : set_mine(32w1 << 24);  25 : set_mine(32w1 << 25);  26 : set_mine(32w1 << 26);
            27 : set_mine(32w1 << 27);  28 : set_mine(32w1 << 28);  29 : set_mine(32w1 << 29);
            30 : set_mine(32w1 << 30);  31 : set_mine(32w1 << 31);
        }
    }

    apply {
        local_address.apply();
        admission.apply();
        admitted_job.apply();
        admitted_token.apply();
        from_parent.apply();
        parent_token.apply();
        word_limit.apply();
        slot_range.apply();
        lengths.apply();
        worker_bit.apply();
        if (hdr.homagg.offset == POISON_OFFSET) {
            meta.offset_max = 1;
        }
        meta.key_rest = use_key_of.get({hdr.homagg.tag, (bit<8>) hdr.homagg.op, hdr.homagg.word_count[7:0]});
    }
}

#undef LENGTH_ENTRY

#endif
