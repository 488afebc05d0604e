/* use_key.p4: per cell, the current use's offset, beside a copy of its key.
 *
 * (v1model: the upper half of ../state.p4's use_key; emulator: the offset in JobState.key.)  The
 * pair {offset, key} of cell = 2 * slot + bank; key mirrors worker_bitmap.p4's (it changes on the
 * same packets: a FIRST), so this register can tell the verdict whether the packet's key was the
 * use's, and check the offset.  Two RegisterActions, chosen by the missing set worker_bitmap.p4
 * returned (a register's update may depend only on registers accessed before it):
 *   at_done     (missing was 0: the use is complete, or the cell never used): if key differs,
 *               store the packet's offset and key (the FIRST worker_bitmap.p4 made)
 *   in_progress (missing was not 0): if key is equal and the offset differs, poison the use:
 *               offset := 0xFFFFFFFF, which no packet's offset is taken to equal (admission.p4 sets
 *               meta.offset_max for offset 0xFFFFFFFF and the verdict never accepts it)
 *   peek        trees: a result from the job's parent (FLAG_RESULT, past admission): no change
 * All return the predicate of (offset equal, key equal) as they were before the packet: the
 * 4-bit value 1 << (offset_equal + 2 * key_equal) (PRED_* in tofino_config.p4).
 */
#ifndef HOMAGG_TOFINO_USE_KEY_P4
#define HOMAGG_TOFINO_USE_KEY_P4

struct use_offset_t {
    bit<32> offset;          /* lo: the use's offset (0xFFFFFFFF: poisoned) */
    bit<32> key;             /* hi: the use's key, as worker_bitmap.p4's */
}

control UseKey(inout tofino_headers_t hdr, inout ig_meta_t meta) {
    Register<use_offset_t, bit<16>>(POOL_CELLS) use_offset;

    RegisterAction<use_offset_t, bit<16>, bit<4>>(use_offset) at_done = {
        void apply(inout use_offset_t value, out bit<4> pred) {
            pred = this.predicate(value.offset == hdr.homagg.offset, value.key == meta.key_rest);
            if (value.key != meta.key_rest) {
                value.offset = hdr.homagg.offset;
                value.key = meta.key_rest;
            }
        }
    };

    RegisterAction<use_offset_t, bit<16>, bit<4>>(use_offset) in_progress = {
        void apply(inout use_offset_t value, out bit<4> pred) {
            pred = this.predicate(value.offset == hdr.homagg.offset, value.key == meta.key_rest);
            if (value.key == meta.key_rest && value.offset != hdr.homagg.offset) {
                value.offset = POISON_OFFSET;
            }
        }
    };

    RegisterAction<use_offset_t, bit<16>, bit<4>>(use_offset) read_only = {
        void apply(inout use_offset_t value, out bit<4> pred) {
            pred = this.predicate(value.offset == hdr.homagg.offset, value.key == meta.key_rest);
        }
    };

    action peek() {
        meta.use_pred = read_only.execute(meta.cell);
    }

    action done() {
        meta.use_pred = at_done.execute(meta.cell);
        meta.unseen = meta.missing & meta.mine;
        meta.left = meta.missing & meta.others;
    }

    action open() {
        meta.use_pred = in_progress.execute(meta.cell);
        meta.unseen = meta.missing & meta.mine;
        meta.left = meta.missing & meta.others;
    }

    table offset_check {
        key = {
            hdr.homagg.flags : ternary;
            meta.missing     : ternary;
        }
        actions = { peek; done; open; @defaultonly NoAction; }
        const default_action = NoAction();   /* never taken: the entries cover every key */
        size = 4;
        const entries = {
            (FLAG_RESULT &&& FLAG_RESULT, _) : peek();   /* trees: a result from the parent */
            (_, 0)                           : done();
            (_, _)                           : open();
        }
    }

    apply {
        offset_check.apply();
    }
}

#endif
