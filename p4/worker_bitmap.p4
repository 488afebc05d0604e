/* worker_bitmap.p4: duplicate, retransmission and stale-copy detection.
 *
 * Stage 3 (switch_emulator/bitmap.py, same verdicts and state changes; p4/tofino/worker_bitmap.p4,
 * use_key.p4 and counter.p4 on Tofino).  A cell holds one use: its key (tag, op, word_count), its
 * offset (use_key's upper half; POISON_OFFSET: poisoned), the workers marked in it (bm) and their
 * count c.  The cell is done when c == 0 (never used under this epoch) or c == world_size.  A packet
 * of worker w is the use's (same) when its (tag, op, word_count) are; ok when same and its offset
 * is the use's (never POISON_OFFSET).
 *   not same:   FIRST if done, else DUPLICATE if w in bm, else CONFLICT
 *   w in bm:    ANSWER if c == world_size and ok and FLAG_RETRANSMIT, STALE if ... and no flag,
 *               else DUPLICATE
 *   otherwise:  ADD if ok, else CONFLICT
 * The state change is a function of the state and the packet, not of the verdict (Tofino marks in
 * the register it reads the key from, before the offset is known): the same key marks w (bm |= w,
 * c + 1 if it was not marked); not the same key on a done cell starts a new use (bm := w, c := 1,
 * key, offset and epoch stored); the same key with another offset while the use is in progress
 * poisons it (offset := POISON_OFFSET): it never completes with an ok packet nor answers.  The two
 * banks of a slot are independent.  A cell written under another epoch (an earlier admission,
 * state.p4) counts as zero: bm = 0, c = 0.
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
        bit<32> pkt_use = hdr.homagg.tag ++ (bit<8>) hdr.homagg.op ++ (bit<8>) hdr.homagg.word_count;
        bool same = meta.count != 0 && stored[31:0] == pkt_use;
        bool ok = same && stored[63:32] == hdr.homagg.offset && hdr.homagg.offset != POISON_OFFSET;
        bool done = meta.count == 0 || meta.count == meta.world_size;
        bool seen = (bm & mine) != 0;

        if (!same) {
            if (done) {
                meta.verdict = VERDICT_FIRST;
            } else if (seen) {
                meta.verdict = VERDICT_DUPLICATE;
            } else {
                meta.verdict = VERDICT_CONFLICT;
            }
        } else if (seen) {
            if (meta.count == meta.world_size && ok) {
                if ((hdr.homagg.flags & FLAG_RETRANSMIT) != 0) {
                    meta.verdict = VERDICT_ANSWER;
                    meta.complete = true;
                } else {
                    meta.verdict = VERDICT_STALE;
                }
            } else {
                meta.verdict = VERDICT_DUPLICATE;
            }
        } else if (ok) {
            meta.verdict = VERDICT_ADD;
        } else {
            meta.verdict = VERDICT_CONFLICT;
        }

        if (!same) {
            if (done) {
                worker_bitmap.write(meta.cell, mine);
                meta.count = 1;
                contributions.write(meta.cell, 1);
                use_key.write(meta.cell, hdr.homagg.offset ++ pkt_use);
                cell_epoch.write(meta.cell, meta.epoch);
            }
        } else {
            if (!seen) {
                worker_bitmap.write(meta.cell, bm | mine);
                meta.count = meta.count + 1;
                contributions.write(meta.cell, meta.count);
            }
            if (!done && stored[63:32] != hdr.homagg.offset) {
                use_key.write(meta.cell, POISON_OFFSET ++ stored[31:0]);
            }
        }
    }
}

#endif
