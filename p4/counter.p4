/* counter.p4: completion of a cell.
 *
 * Stage 4 (switch_emulator/completion.py).  For a FIRST or ADD packet, contributions[cell] becomes
 * 1 (FIRST) or count + 1 (ADD); the packet completes the cell when it reaches the job's
 * world_size.  The count is not reset at completion: the cell stays complete, so retransmissions
 * are answered with the stored result, until the next use's first write.
 */
#ifndef HOMAGG_COUNTER_P4
#define HOMAGG_COUNTER_P4

control Completion(inout headers_t hdr, inout metadata_t meta) {
    apply {
        if (meta.verdict == VERDICT_FIRST || meta.verdict == VERDICT_ADD) {
            bit<8> count;
            if (meta.verdict == VERDICT_FIRST) {
                count = 1;
            } else {
                count = meta.count + 1;
            }
            contributions.write(meta.cell, count);
            meta.count = count;
            meta.complete = (count == meta.world_size);
        }
    }
}

#endif
