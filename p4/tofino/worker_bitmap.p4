/* worker_bitmap.p4: per cell, the workers still missing from its current use, and the use's key,
 * in one register pair: the verdict's state is read before anything is marked.
 *
 * (v1model: ../worker_bitmap.p4; emulator: switch_emulator/bitmap.py, the same rules.)  One
 * RegisterAction, one access per packet, on the pair {missing, key} of cell = 2 * slot + bank:
 *   key == the packet's (tag, op, word_count)  -> missing := missing & others   (marks the worker;
 *                                                 a no-op when it was marked already)
 *   else, missing == 0 (complete or never used) -> missing := others, key := the packet's (FIRST)
 *   else                                        -> nothing (another use is in progress)
 * and returns missing as it was before the packet.  others = the job's workers but the sender
 * (admission.p4's admitted_job entry), so missing == 0 exactly when every worker of the job is
 * marked, and the sender is counted already when its bit is 0 in the returned value.  A cell cleared
 * by the controller (missing 0, key 0) is never used: no packet's key is 0 (word_count >= 1).
 * The key compared here is the use key without the offset: the pair has 32 bits left beside the
 * bitmap, and a register's update can depend only on registers accessed before it; use_key.p4
 * checks the offset next (a mismatch poisons the use: its result is never sent).
 * The mark is an action of the table that also turns admission.p4's lookups into the drop reason,
 * so admission and the mark take two stages, not three.  Trees: a result from the job's parent
 * (FLAG_RESULT) that passes its checks only reads the pair (peek_cell): counter.p4 takes it when
 * its use is the cell's, complete (missing 0) and still waiting (the down bit).
 */
#ifndef HOMAGG_TOFINO_WORKER_BITMAP_P4
#define HOMAGG_TOFINO_WORKER_BITMAP_P4

struct use_state_t {
    bit<32> missing;         /* lo: workers of the job not yet marked in the cell's current use */
    bit<32> key;             /* hi: the use's tag ++ op ++ word_count[7:0] (meta.key_rest) */
}

/* Rows for one valid op K, most specific first: the accept row, then each check's failure in the
 * reverse of the v1model program's order (the first matching row wins); then a result
 * (FLAG_RESULT) from the job's parent (trees: peek, or its failures in the reverse of the
 * emulator's order: not the parent -> drop_result_flag, token, word count, slot range).  Key
 * order: header valid, udp length, version, op, word_count, parser error, lengths consistent,
 * flags, source known, job and worker consistent, token consistent, word count allowed, slot in
 * range, parent known, parent's token consistent. */
#define ROWS_FOR_OP(K) \
    (true, _, HOMAGG_VERSION, K, 0, _, _, _, _, _, _, _, _, _, _)          : reject((bit<8>) DROP_LENGTH); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, 1, 1, 1, 1, _, _)    : mark(); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, 1, 1, 1, _, _, _)    : reject((bit<8>) DROP_SLOT_RANGE); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, 1, 1, _, _, _, _)    : reject((bit<8>) DROP_WORD_COUNT); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, 1, _, _, _, _, _)    : reject((bit<8>) DROP_TOKEN); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, 1, _, _, _, _, _, _)    : reject((bit<8>) DROP_ADMISSION_MISMATCH); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 0 &&& 1, _, _, _, _, _, _, _)    : reject((bit<8>) DROP_UNKNOWN_SOURCE); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 1 &&& 1, _, _, _, 1, 1, 1, 1)    : peek(); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 1 &&& 1, _, _, _, 1, _, 1, 1)    : reject((bit<8>) DROP_SLOT_RANGE); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 1 &&& 1, _, _, _, _, _, 1, 1)    : reject((bit<8>) DROP_WORD_COUNT); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, 1 &&& 1, _, _, _, _, _, 1, _)    : reject((bit<8>) DROP_TOKEN); \
    (true, _, HOMAGG_VERSION, K, _, 0, 1, _, _, _, _, _, _, _, _)          : reject((bit<8>) DROP_RESULT_FLAG); \
    (true, _, HOMAGG_VERSION, K, _, _, _, _, _, _, _, _, _, _, _)          : reject((bit<8>) DROP_LENGTH);

control WorkerBitmap(inout tofino_headers_t hdr, inout ig_meta_t meta, in bit<16> parser_err) {
    Register<use_state_t, bit<16>>(POOL_CELLS) use_state;

    RegisterAction<use_state_t, bit<16>, bit<32>>(use_state) mark_cell = {
        void apply(inout use_state_t value, out bit<32> missing) {
            missing = value.missing;
            if (value.key == meta.key_rest) {
                value.missing = value.missing & meta.others;
            } else if (value.missing == 0) {
                value.missing = meta.others;
                value.key = meta.key_rest;
            }
        }
    };

    /* trees: a result from the parent reads the cell, changes nothing (counter.p4 decides) */
    RegisterAction<use_state_t, bit<16>, bit<32>>(use_state) peek_cell = {
        void apply(inout use_state_t value, out bit<32> missing) {
            missing = value.missing;
        }
    };

    action mark() { meta.missing = mark_cell.execute(meta.cell); }
    action peek() { meta.missing = peek_cell.execute(meta.cell); }
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
            meta.parent_known     : ternary;
            meta.parent_token_ok  : ternary;
        }
        actions = { mark; peek; reject; }
        const default_action = reject((bit<8>) DROP_SHORT);
        size = 64;
        const entries = {
            (false, _, _, _, _, _, _, _, _, _, _, _, _, _, _)                      : reject((bit<8>) DROP_SHORT);
            (true, 0 .. 8 + HEADER_LEN - 1, _, _, _, _, _, _, _, _, _, _, _, _, _)         : reject((bit<8>) DROP_SHORT);
            ROWS_FOR_OP(OP_ADD)
            ROWS_FOR_OP(OP_OR)
            ROWS_FOR_OP(OP_MAX)
            (true, _, HOMAGG_VERSION, _, _, _, _, _, _, _, _, _, _, _, _)          : reject((bit<8>) DROP_OP);
            (true, _, _, _, _, _, _, _, _, _, _, _, _, _, _)                       : reject((bit<8>) DROP_VERSION);
        }
    }

    apply {
        admit_and_mark.apply();
    }
}

#undef ROWS_FOR_OP

#endif
