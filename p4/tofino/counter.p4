/* counter.p4: contributions per cell, and the packet's verdict.
 *
 * One 8-bit register per cell (v1model: ../counter.p4), three RegisterActions chosen by what the
 * bitmap and the key said (worker_bitmap.p4, use_key.p4):
 *   bitmap was empty, key differs  -> FIRST:  count := 1
 *   worker not yet counted, key equal, count < world_size -> ADD: count += 1 (returns the new count)
 *   anything else                  -> read the count (ANSWER needs "complete")
 * Verdicts (switch_emulator/bitmap.py names):
 *   seen:                       ANSWER if the key is equal and count == world_size, else DUPLICATE
 *   bitmap empty:               STALE if the key is equal (a late copy of the completed use), else FIRST
 *   otherwise, key equal:       ADD, or STALE when the use is already complete
 *   otherwise, key differs:     STALE when the use is complete, else CONFLICT
 * meta.complete: FIRST/ADD that brought the count to world_size, or ANSWER.
 */
#ifndef HOMAGG_TOFINO_COUNTER_P4
#define HOMAGG_TOFINO_COUNTER_P4

control Completion(inout tofino_headers_t hdr, inout ig_meta_t meta) {
    Register<bit<8>, bit<16>>(POOL_CELLS) contributions;

    RegisterAction<bit<8>, bit<16>, bit<8>>(contributions) count_first = {
        void apply(inout bit<8> value, out bit<8> count) {
            value = 1;
            count = 1;
        }
    };

    /* returns the new count, or 0 when the use was complete already (nothing changes) */
    RegisterAction<bit<8>, bit<16>, bit<8>>(contributions) count_add = {
        void apply(inout bit<8> value, out bit<8> count) {
            if (value < meta.world_size) {
                value = value + 1;
                count = value;
            } else {
                count = 0;
            }
        }
    };

    RegisterAction<bit<8>, bit<16>, bit<8>>(contributions) count_read = {
        void apply(inout bit<8> value, out bit<8> count) {
            count = value;
        }
    };

    /* which access, by (seen, bitmap before, key equal); the path tells the verdict below */
    action first()      { meta.count = count_first.execute(meta.cell); meta.path = PATH_FIRST; meta.first = 1; }
    action add()        { meta.count = count_add.execute(meta.cell);   meta.path = PATH_ADD; }
    action read_seen()  { meta.count = count_read.execute(meta.cell);  meta.path = PATH_SEEN; }
    action read_other() { meta.count = count_read.execute(meta.cell);  meta.path = PATH_OTHER; }
    action late_copy()  { meta.path = PATH_LATE; meta.count = 0; }

    table contribution {
        key = {
            meta.seen       : ternary;
            meta.old_bitmap : ternary;
            meta.offset_match : ternary;
            meta.rest_match   : ternary;
        }
        actions = { first; add; read_seen; read_other; late_copy; @defaultonly NoAction; }
        const default_action = NoAction();   /* never taken: the entries cover every key */
        size = 8;   /* first matching row wins */
        const entries = {
            (0, 0, 1, 1) : late_copy();    /* bank empty, the completed use's key: STALE */
            (0, 0, _, _) : first();        /* bank empty, new key: FIRST */
            (0, _, 1, 1) : add();          /* not counted, same key: ADD (or STALE if complete) */
            (0, _, _, _) : read_other();   /* not counted, other key: CONFLICT (or STALE if complete) */
            (_, _, 1, 1) : read_seen();    /* counted already: ANSWER if complete, else DUPLICATE */
            (_, _, _, _) : read_seen();    /* counted already: DUPLICATE */
        }
    }

    apply {
        contribution.apply();
        if (meta.path == PATH_FIRST) {
            meta.verdict = VERDICT_FIRST;
            if (meta.world_size == 1) {
                meta.complete = true;
            }
        } else if (meta.path == PATH_LATE) {
            meta.verdict = VERDICT_STALE;
        } else if (meta.path == PATH_ADD) {
            if (meta.count == 0) {
                meta.verdict = VERDICT_STALE;
            } else {
                meta.verdict = VERDICT_ADD;
                if (meta.count == meta.world_size) {
                    meta.complete = true;
                }
            }
        } else if (meta.path == PATH_OTHER) {
            if (meta.count == meta.world_size) {
                meta.verdict = VERDICT_STALE;
            } else {
                meta.verdict = VERDICT_CONFLICT;
            }
        } else if (meta.offset_match == 1 && meta.rest_match == 1 && meta.count == meta.world_size) {
            meta.verdict = VERDICT_ANSWER;
            meta.complete = true;
        } else {
            meta.verdict = VERDICT_DUPLICATE;
        }
    }
}

#endif
