/* counter.p4: completion of a cell.
 *
 * contributions[cell] counts the workers that contributed to the cell's current round: 1 on the
 * first write, +1 on every further new contribution.  The cell is complete when the count equals
 * the job's worker count; it stays complete (the count is not reset) until the next round's first
 * write, so a retransmission into a complete cell can be answered with the stored result.
 */
#ifndef HOMAGG_COUNTER_P4
#define HOMAGG_COUNTER_P4

control Completion(inout headers_t hdr, inout metadata_t meta) {
    register<bit<8>>(POOL_CELLS) contributions;

    apply {
        bit<8> count;
        contributions.read(count, meta.cell);
        if (meta.is_new) {
            if (meta.first) {
                count = 1;
            } else {
                count = count + 1;
            }
            contributions.write(meta.cell, count);
        }
        meta.complete = (count == meta.num_workers);
    }
}

#endif
