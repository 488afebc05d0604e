/* combine.p4: fold a contribution into its cell, or fetch a complete cell's result.
 *
 * Stage 5 (switch_emulator/combine.py).  One register per payload word (pool_w00 .. pool_w31 in
 * state.p4), indexed by cell.  Words beyond word_count are invalid headers: their register cells
 * receive don't-care values that never leave the switch (a use's word_count is part of its key,
 * and a FIRST write overwrites every word).
 *   FIRST  : cell := payload
 *   ADD/OP_ADD : cell := cell + payload  (mod 2^32, two's complement wrap, like numpy int32)
 *   ADD/OP_OR  : cell := cell | payload
 *   ADD/OP_MAX : cell := signed max(cell, payload)  (unsigned compare with the sign bit flipped)
 * and the payload becomes the new cell value, so a completing packet carries the result.
 *   ANSWER : payload := cell (the stored result, for the unicast answer; at a child whose result
 *            has not come down, the cell's combined words, sent up again: tree.p4).
 *   a result from the parent (trees, tree.p4's ResultDown passed it): cell := payload.
 */
#ifndef HOMAGG_COMBINE_P4
#define HOMAGG_COMBINE_P4

#define SIGN_BIT 32w0x80000000
#define W(I) hdr.words[I].value

#define FIRST_WORD(NN, I, N) pool_w##NN.write(meta.cell, W(I));

#define ADD_WORD(NN, I, N) \
    pool_w##NN.read(v, meta.cell); v = v + W(I); pool_w##NN.write(meta.cell, v); W(I) = v;

#define OR_WORD(NN, I, N) \
    pool_w##NN.read(v, meta.cell); v = v | W(I); pool_w##NN.write(meta.cell, v); W(I) = v;

#define MAX_WORD(NN, I, N) \
    pool_w##NN.read(v, meta.cell); \
    if ((v ^ SIGN_BIT) < (W(I) ^ SIGN_BIT)) { v = W(I); } \
    pool_w##NN.write(meta.cell, v); W(I) = v;

#define READ_WORD(NN, I, N) pool_w##NN.read(W(I), meta.cell);

control Combine(inout headers_t hdr, inout metadata_t meta) {
    action first_write() { FOR_EACH_WORD(FIRST_WORD) }
    action combine_add() { bit<32> v; FOR_EACH_WORD(ADD_WORD) }
    action combine_or()  { bit<32> v; FOR_EACH_WORD(OR_WORD) }
    action combine_max() { bit<32> v; FOR_EACH_WORD(MAX_WORD) }
    action read_result() { FOR_EACH_WORD(READ_WORD) }

    apply {
        if (meta.from_parent || meta.verdict == VERDICT_FIRST) {
            first_write();
        } else if (meta.verdict == VERDICT_ADD) {
            if (hdr.homagg.op == OP_ADD) {
                combine_add();
            } else if (hdr.homagg.op == OP_OR) {
                combine_or();
            } else {
                combine_max();
            }
        } else if (meta.verdict == VERDICT_ANSWER) {
            read_result();
        }
    }
}

#undef FIRST_WORD
#undef ADD_WORD
#undef OR_WORD
#undef MAX_WORD
#undef READ_WORD
#undef W

#endif
