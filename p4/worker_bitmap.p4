/* worker_bitmap.p4: has this worker contributed to this cell already?
 *
 * worker_bitmap[cell] holds one bit per worker that contributed to the cell's current round.
 * A new contribution sets the worker's bit in its cell and clears it in the other bank's cell
 * (the worker got that bank's result, or it would not have moved on).  Hence, with SwitchML's
 * self-clocking (a worker reuses a slot only after it received the slot's previous result), a
 * cell's bitmap is empty exactly when a new round starts in it: the first contribution
 * overwrites the cell's words instead of combining with stale ones.
 */
#ifndef HOMAGG_WORKER_BITMAP_P4
#define HOMAGG_WORKER_BITMAP_P4

control WorkerBitmap(inout headers_t hdr, inout metadata_t meta) {
    register<bit<32>>(POOL_CELLS) worker_bitmap;

    apply {
        bit<32> mine = (bit<32>) 1 << hdr.homagg.worker_id;
        bit<32> seen;
        worker_bitmap.read(seen, meta.cell);
        if ((seen & mine) == 0) {
            meta.is_new = true;
            meta.first = (seen == 0);
            worker_bitmap.write(meta.cell, seen | mine);
            bit<32> other;
            worker_bitmap.read(other, meta.other_cell);
            worker_bitmap.write(meta.other_cell, other & ~mine);
        } else {
            meta.is_new = false;
            meta.first = false;
        }
    }
}

#endif
