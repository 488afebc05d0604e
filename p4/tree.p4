/* tree.p4: the child role of a job at this switch (docs/trees.md; switch_emulator/pipeline.py and
 * replication.py's Replicator.up are the reference).
 *
 * Per job a switch is the root (no uplink entry: today's one-switch behaviour) or a child (an
 * uplink entry: this switch's worker id at the parent, its own data address, the parent's data
 * address and the port towards it).  Per cell, down[cell] (state.p4): the parent's result of the
 * current use came down.
 *
 *   TreeRole    a member's packet: is the job a child here (uplink); FIRST clears down; an ANSWER
 *               at a child reads down (0: the use goes up again, flagged; 1: unicast from the cell)
 *   ResultDown  a result from the job's parent (admission.p4's parent_result): for the cell's
 *               current use (same offset, tag, op, word_count), complete here (under this
 *               epoch) and down = 0: down := 1 (combine.p4 then writes the words into the cell,
 *               replicate.p4 multicasts them to the members, result_down); else drop_stale_result
 *               (another use, one still in progress, or a second copy)
 *   SendUp      the packet becomes this child's contribution to the parent (ingress rewrite of the
 *               completing packet, whose words are the cell's combined words, or of an ANSWER,
 *               whose words combine.p4 read from the cell): worker_id = child_id, flags 0 or
 *               FLAG_RETRANSMIT, reserved 0, from this switch's data address (UDP source port
 *               HOMAGG_UDP_PORT, where results from the parent come back) to the parent's, IPv4
 *               identification 0, DF, TTL RESULT_TTL, UDP checksum 0 (as results leave)
 * Job, token, slot, bank, tag, offset, op and word count stay the packet's: the same at every
 * switch of a tree.
 */
#ifndef HOMAGG_TREE_P4
#define HOMAGG_TREE_P4

control TreeRole(inout headers_t hdr, inout metadata_t meta) {
    action child(bit<8> child_id, bit<48> switch_mac, bit<32> switch_ip, bit<48> parent_mac, bit<32> parent_ip,
                 bit<16> parent_port, bit<9> uplink_port) {
        meta.is_child = true;
        meta.child_id = child_id;
        meta.switch_mac = switch_mac;
        meta.switch_ip = switch_ip;
        meta.parent_mac = parent_mac;
        meta.parent_ip = parent_ip;
        meta.parent_port = parent_port;
        meta.uplink_port = uplink_port;
    }

    table uplink {
        key = { meta.job_id : exact; }
        actions = { child; @defaultonly NoAction; }
        const default_action = NoAction();
        size = ADMISSION_ENTRIES;
    }

    apply {
        uplink.apply();
        if (meta.verdict == VERDICT_FIRST) {
            down.write(meta.cell, 0);
        } else if (meta.verdict == VERDICT_ANSWER && meta.is_child) {
            bit<1> d;
            down.read(d, meta.cell);
            meta.down = d == 1;
        }
    }
}

control ResultDown(inout headers_t hdr, inout metadata_t meta) {
    apply {
        bit<8> count;
        bit<64> stored;
        bit<32> epoch;
        bit<1> d;
        contributions.read(count, meta.cell);
        use_key.read(stored, meta.cell);
        cell_epoch.read(epoch, meta.cell);
        down.read(d, meta.cell);
        if (epoch != meta.epoch) {
            count = 0;  /* written under an earlier admission: never used for this job (state.p4) */
        }
        bit<64> key = hdr.homagg.offset ++ hdr.homagg.tag ++ (bit<8>) hdr.homagg.op ++ (bit<8>) hdr.homagg.word_count;
        if (count != meta.world_size || stored != key || d == 1) {
            meta.drop_reason = DROP_STALE_RESULT;
        } else {
            down.write(meta.cell, 1);
        }
    }
}

control SendUp(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t standard_metadata,
               in bit<8> flags) {
    apply {
        meta.up = true;
        standard_metadata.egress_spec = meta.uplink_port;
        hdr.ethernet.dst_addr = meta.parent_mac;
        hdr.ethernet.src_addr = meta.switch_mac;
        hdr.ipv4.diffserv = 0;
        hdr.ipv4.identification = 0;
        hdr.ipv4.flags = RESULT_IP_FLAGS;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.ipv4.src_addr = meta.switch_ip;
        hdr.ipv4.dst_addr = meta.parent_ip;
        hdr.udp.src_port = HOMAGG_UDP_PORT;
        hdr.udp.dst_port = meta.parent_port;
        hdr.udp.checksum = 0;
        hdr.homagg.flags = flags;
        hdr.homagg.worker_id = meta.child_id;
        hdr.homagg.reserved = 0;
    }
}

#endif
