/* state.p4: the switch's registers, one cell per (slot, bank) (switch_emulator/state.py).
 *
 * cell = 2 * slot + bank (slot absolute in the pool).  For each cell:
 *   worker_bitmap[cell]  workers marked in the current use of the cell (bit worker_id)
 *   contributions[cell]  workers marked: 0 (never used since the job was admitted)
 *                        .. world_size (done; stays so until the next use's first write)
 *   use_key[cell]        the current use: offset(32) ++ tag(16) ++ op(8) ++ word_count(8); offset
 *                        POISON_OFFSET when poisoned (worker_bitmap.p4)
 *   pool_wNN[cell]       payload word NN of the combined result (NN = 00 .. 31)
 *   cell_epoch[cell]     the admission epoch of the job that wrote the cell's first contribution
 *   down[cell]           trees, at a child: 1 once the parent's result of the current use came down
 *                        (pool_wNN then hold the tree's result); 0 from the use's FIRST on
 *                        (tree.p4).  No epoch needed: a cell of another epoch reads as never used,
 *                        so its next packet is a FIRST, which clears down before it can matter.
 *
 * Zeroing without register writes: P4Runtime register writes are not implemented by PI (the
 * P4Runtime server of simple_switch_grpc), and simple_switch_grpc has no thrift server.  So every
 * admission of a job gets a fresh nonzero epoch from the controller (an admit() action parameter);
 * a cell whose cell_epoch differs from the packet's job epoch is read as zero (bitmap 0, count 0:
 * never used), exactly like the emulator's freshly zeroed JobState.  A FIRST write stores the epoch.
 */
#ifndef HOMAGG_STATE_P4
#define HOMAGG_STATE_P4

#include "words.p4"

register<bit<32>>(POOL_CELLS) worker_bitmap;
register<bit<8>>(POOL_CELLS)  contributions;
register<bit<64>>(POOL_CELLS) use_key;
register<bit<32>>(POOL_CELLS) cell_epoch;
register<bit<1>>(POOL_CELLS)  down;

#define DECLARE_WORD(NN, I, N) register<bit<32>>(POOL_CELLS) pool_w##NN;
FOR_EACH_WORD(DECLARE_WORD)
#undef DECLARE_WORD

#endif
