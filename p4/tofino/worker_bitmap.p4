/* worker_bitmap.p4: per slot, the worker bitmaps of both banks in one register pair.
 *
 * (v1model: ../worker_bitmap.p4 reads this cell's bitmap and read-modify-writes the other bank's:
 * two accesses of one register, which Tofino does not allow.)  Here, as SwitchML's
 * UpdateAndCheckWorkerBitmap, one RegisterAction per bank marks the worker in one access:
 *   mark_bank0: old := bank0; bank0 |= mine; bank1 &= ~mine; return old
 *   mark_bank1: the same with the banks swapped
 * and returns the bank's bitmap before the packet (use_key.p4 computes seen = old & mine).
 * The mark is an action of the table that also turns admission.p4's lookups into the drop reason,
 * so admission and the bitmap take two stages, not three.
 *
 * The mark happens before the key and the count are known (a register's update can only depend
 * on registers accessed before it, and the key and count updates depend on the bitmap): so a
 * packet that the later stages find STALE or CONFLICT has marked its worker already.  This is the
 * one semantic difference from the emulator; docs/p4-tofino.md says when it matters.
 */
#ifndef HOMAGG_TOFINO_WORKER_BITMAP_P4
#define HOMAGG_TOFINO_WORKER_BITMAP_P4

struct bitmap_pair_t {
    bit<32> bank0;
    bit<32> bank1;
}

/* Rows for one valid op K, most specific first: the accept rows, then each check's failure in the
 * reverse of the v1model program's order (the first matching row wins).  Key order: header valid,
 * udp length, version, op, word_count, parser error, lengths consistent, flags, source known, job
 * and worker consistent, token consistent, word count allowed, slot in range, bank. */
#define ROWS_FOR_OP(K) \
    (true, _, HOMAGG_VERSION, K, 0, _, _, _, _, _, _, _, _, _)          : reject((bit<8>) DROP_LENGTH); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, 1, 1, 1, 1, 0)    : mark0(); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, 1, 1, 1, 1, 1)    : mark1(); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, 1, 1, 1, _, _)    : reject((bit<8>) DROP_SLOT_RANGE); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, 1, 1, _, _, _)    : reject((bit<8>) DROP_WORD_COUNT); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, 1, _, _, _, _)    : reject((bit<8>) DROP_TOKEN); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, _, _, _, _, _)    : reject((bit<8>) DROP_ADMISSION_MISMATCH); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, _, _, _, _, _, _)    : reject((bit<8>) DROP_UNKNOWN_SOURCE); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, _, _, _, _, _, _, _)          : reject((bit<8>) DROP_RESULT_FLAG); \
    (true, _, HOMAGG_VERSION, K, _, _, _, _, _, _, _, _, _, _)          : reject((bit<8>) DROP_LENGTH);

control WorkerBitmap(inout tofino_headers_t hdr, inout ig_meta_t meta, in bit<16> parser_err) {
    Register<bitmap_pair_t, bit<16>>(SLOT_POOL_SIZE) worker_bitmap;

    RegisterAction<bitmap_pair_t, bit<16>, bit<32>>(worker_bitmap) mark_bank0 = {
        void apply(inout bitmap_pair_t value, out bit<32> old) {
            old = value.bank0;
            value.bank0 = value.bank0 | meta.mine;
            value.bank1 = value.bank1 & ~meta.mine;
        }
    };

    RegisterAction<bitmap_pair_t, bit<16>, bit<32>>(worker_bitmap) mark_bank1 = {
        void apply(inout bitmap_pair_t value, out bit<32> old) {
            old = value.bank1;
            value.bank0 = value.bank0 & ~meta.mine;
            value.bank1 = value.bank1 | meta.mine;
        }
    };

    action mark0() { meta.old_bitmap = mark_bank0.execute(meta.slot_index); }
    action mark1() { meta.old_bitmap = mark_bank1.execute(meta.slot_index); }
    action reject(bit<8> reason) { meta.drop_reason = reason; }

    /* the drop reason of admission.p4's lookups and the header checks, or the mark */
    table admit_and_mark {
        key = {
            hdr.homagg.isValid()  : exact;
            hdr.udp.length        : range;
            hdr.homagg.version    : ternary;
            hdr.homagg.op         : ternary;
            hdr.homagg.word_count : ternary;
            parser_err            : ternary;
            meta.length_ok        : ternary;
            hdr.homagg.flags      : ternary;
            meta.source_known     : ternary;
            meta.job_ok           : ternary;
            meta.token_ok         : ternary;
            meta.words_ok         : ternary;
            meta.in_range         : ternary;
            hdr.homagg.bank       : ternary;
        }
        actions = { mark0; mark1; reject; }
        const default_action = reject((bit<8>) DROP_SHORT);
        size = 64;
        const entries = {
            (false, _, _, _, _, _, _, _, _, _, _, _, _, _)                      : reject((bit<8>) DROP_SHORT);
            (true, 0 .. 8 + HEADER_LEN - 1, _, _, _, _, _, _, _, _, _, _, _, _)         : reject((bit<8>) DROP_SHORT);
            ROWS_FOR_OP(OP_ADD)
            ROWS_FOR_OP(OP_OR)
            ROWS_FOR_OP(OP_MAX)
            (true, _, HOMAGG_VERSION, _, _, _, _, _, _, _, _, _, _, _)          : reject((bit<8>) DROP_OP);
            (true, _, _, _, _, _, _, _, _, _, _, _, _, _)                       : reject((bit<8>) DROP_VERSION);
        }
    }

    apply {
        admit_and_mark.apply();
    }
}

#undef ROWS_FOR_OP

#endif
