/* combine.p4: fold a new contribution into its cell, or fetch a complete cell's result.
 *
 * One register per payload word (pool_w00 .. pool_w31), indexed by cell.  For a new contribution:
 *   first write : cell := payload                    (the bitmap was empty)
 *   OP_ADD      : cell := cell + payload   (mod 2^32, two's complement wrap, like the emulator)
 *   OP_OR       : cell := cell | payload
 *   OP_MAX      : cell := signed max(cell, payload)  (compare with the sign bit flipped)
 * and the payload is overwritten with the new cell value, so a completing packet carries the
 * result.  For a retransmission into a complete cell, the payload is overwritten with the stored
 * result (the unicast answer).  Packets of a cell that is neither new nor complete never get here.
 */
#ifndef HOMAGG_COMBINE_P4
#define HOMAGG_COMBINE_P4

#define SIGN_BIT 32w0x80000000

#define FOR_EACH_WORD(X) \
    X(00) X(01) X(02) X(03) X(04) X(05) X(06) X(07) \
    X(08) X(09) X(10) X(11) X(12) X(13) X(14) X(15) \
    X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) \
    X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31)

#define DECLARE_WORD(N) register<bit<32>>(POOL_CELLS) pool_w##N;

#define FIRST_WORD(N) pool_w##N.write(meta.cell, hdr.payload.w##N);

#define ADD_WORD(N) \
    pool_w##N.read(v, meta.cell); v = v + hdr.payload.w##N; \
    pool_w##N.write(meta.cell, v); hdr.payload.w##N = v;

#define OR_WORD(N) \
    pool_w##N.read(v, meta.cell); v = v | hdr.payload.w##N; \
    pool_w##N.write(meta.cell, v); hdr.payload.w##N = v;

#define MAX_WORD(N) \
    pool_w##N.read(v, meta.cell); \
    v = ((v ^ SIGN_BIT) < (hdr.payload.w##N ^ SIGN_BIT)) ? hdr.payload.w##N : v; \
    pool_w##N.write(meta.cell, v); hdr.payload.w##N = v;

#define READ_WORD(N) pool_w##N.read(hdr.payload.w##N, meta.cell);

control Combine(inout headers_t hdr, inout metadata_t meta) {
    FOR_EACH_WORD(DECLARE_WORD)

    action first_write() { FOR_EACH_WORD(FIRST_WORD) }
    action combine_add() { bit<32> v; FOR_EACH_WORD(ADD_WORD) }
    action combine_or()  { bit<32> v; FOR_EACH_WORD(OR_WORD) }
    action combine_max() { bit<32> v; FOR_EACH_WORD(MAX_WORD) }
    action read_result() { FOR_EACH_WORD(READ_WORD) }

    apply {
        if (meta.is_new) {
            if (meta.first) {
                first_write();
            } else if (hdr.homagg.op == OP_ADD) {
                combine_add();
            } else if (hdr.homagg.op == OP_OR) {
                combine_or();
            } else {
                combine_max();
            }
        } else if (meta.complete) {
            read_result();
        }
    }
}

#undef DECLARE_WORD
#undef FIRST_WORD
#undef ADD_WORD
#undef OR_WORD
#undef MAX_WORD
#undef READ_WORD

#endif
