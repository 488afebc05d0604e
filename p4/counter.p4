/* counter.p4: completion of a cell.
 *
 * Stage 4 (switch_emulator/completion.py).  worker_bitmap.p4 keeps contributions[cell], the
 * workers marked in the cell's current use (meta.count: after this packet); a FIRST or ADD packet
 * completes the cell when it reaches the job's world_size.  The count is not reset at completion:
 * the cell stays complete, so retransmissions are answered with the stored result, until the next
 * use's first write.
 */
#ifndef HOMAGG_COUNTER_P4
#define HOMAGG_COUNTER_P4

control Completion(inout headers_t hdr, inout metadata_t meta) {
    apply {
        if (meta.verdict == VERDICT_FIRST || meta.verdict == VERDICT_ADD) {
            meta.complete = (meta.count == meta.world_size);
        }
    }
}

#endif
