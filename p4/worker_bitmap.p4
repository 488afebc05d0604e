/* worker_bitmap.p4: duplicate, retransmission and stale-copy detection.
 *
 * Stage 3 (switch_emulator/bitmap.py, same verdicts).  A packet of worker w with key
 * k = (offset, tag, op, word_count) at a cell with bitmap bm, count c, stored key sk:
 *   w in bm:              ANSWER if complete and k == sk, else DUPLICATE
 *   c == 0 or complete:   STALE if bm != 0 or k == sk, else FIRST
 *   otherwise:            ADD if k == sk, else CONFLICT
 * (k == sk is false while c == 0: the cell was never used.)  FIRST and ADD mark w: set its bit in
 * this cell and clear it in the other bank's cell (w sending here proves it has the other bank's
 * result: SwitchML's shadow copy).  FIRST also stores k and the job's epoch.  A cell written under
 * another epoch (an earlier admission, state.p4) counts as zero: bm = 0, c = 0.  The other bank's
 * bitmap is cleared regardless of its epoch (a stale value is ignored when it is next read).
 */
#ifndef HOMAGG_WORKER_BITMAP_P4
#define HOMAGG_WORKER_BITMAP_P4

control WorkerBitmap(inout headers_t hdr, inout metadata_t meta) {
    apply {
        bit<32> mine = (bit<32>) 1 << hdr.homagg.worker_id;
        bit<32> bm;
        bit<64> stored;
        bit<32> epoch;
        worker_bitmap.read(bm, meta.cell);
        contributions.read(meta.count, meta.cell);
        use_key.read(stored, meta.cell);
        cell_epoch.read(epoch, meta.cell);
        if (epoch != meta.epoch) {
            /* written under an earlier admission: the cell is zero for this job (state.p4) */
            bm = 0;
            meta.count = 0;
        }
        bit<64> pkt_key = hdr.homagg.offset ++ hdr.homagg.tag ++ (bit<8>) hdr.homagg.op
                      ++ (bit<8>) hdr.homagg.word_count;
        bool same_key = meta.count != 0 && stored == pkt_key;
        bool complete = meta.count == meta.world_size;

        if ((bm & mine) != 0) {
            if (complete && same_key) {
                meta.verdict = VERDICT_ANSWER;
            } else {
                meta.verdict = VERDICT_DUPLICATE;
            }
        } else if (meta.count == 0 || complete) {
            if (bm != 0 || same_key) {
                meta.verdict = VERDICT_STALE;
            } else {
                meta.verdict = VERDICT_FIRST;
            }
        } else if (same_key) {
            meta.verdict = VERDICT_ADD;
        } else {
            meta.verdict = VERDICT_CONFLICT;
        }

        if (meta.verdict == VERDICT_FIRST || meta.verdict == VERDICT_ADD) {
            worker_bitmap.write(meta.cell, bm | mine);
            bit<32> other;
            worker_bitmap.read(other, meta.other_cell);
            worker_bitmap.write(meta.other_cell, other & ~mine);
            if (meta.verdict == VERDICT_FIRST) {
                use_key.write(meta.cell, pkt_key);
                cell_epoch.write(meta.cell, meta.epoch);
            }
        } else if (meta.verdict == VERDICT_ANSWER) {
            meta.complete = true;
        }
    }
}

#endif
