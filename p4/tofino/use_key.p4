/* use_key.p4: the key of a cell's current use: offset and (tag, op, word_count).
 *
 * (v1model: one bit<64> register, ../state.p4.)  Two 32-bit registers per cell, key_offset and
 * key_rest (rest = tag(16) ++ op(8) ++ word_count(8)), each with two RegisterActions:
 *   store (the bank's bitmap was empty: this packet may start a new use): write the packet's half
 *         and return 1 if it equals what was there (a rewrite of an equal key changes nothing)
 *   match (any other packet): return 1 if the halves are equal
 * The keys are equal when both return 1 (counter.p4 matches on both bits).  One register pair
 * compared against 64 bits of packet key does not fit one stateful ALU's input crossbar (measured:
 * bf-p4c places no such table); two 32-bit registers in one stage do.  A cell cleared to zero by the
 * controller never matches (word_count >= 1): "never used".
 */
#ifndef HOMAGG_TOFINO_USE_KEY_P4
#define HOMAGG_TOFINO_USE_KEY_P4

control UseKey(inout tofino_headers_t hdr, inout ig_meta_t meta) {
    Register<bit<32>, bit<16>>(POOL_CELLS) key_offset;
    Register<bit<32>, bit<16>>(POOL_CELLS) key_rest;

    RegisterAction<bit<32>, bit<16>, bit<1>>(key_offset) store_offset = {
        void apply(inout bit<32> value, out bit<1> same) {
            if (value == hdr.homagg.offset) { same = 1; } else { same = 0; }
            value = hdr.homagg.offset;
        }
    };

    RegisterAction<bit<32>, bit<16>, bit<1>>(key_offset) match_offset = {
        void apply(inout bit<32> value, out bit<1> same) {
            if (value == hdr.homagg.offset) { same = 1; } else { same = 0; }
        }
    };

    RegisterAction<bit<32>, bit<16>, bit<1>>(key_rest) store_rest = {
        void apply(inout bit<32> value, out bit<1> same) {
            if (value == meta.key_rest) { same = 1; } else { same = 0; }
            value = meta.key_rest;
        }
    };

    RegisterAction<bit<32>, bit<16>, bit<1>>(key_rest) match_rest = {
        void apply(inout bit<32> value, out bit<1> same) {
            if (value == meta.key_rest) { same = 1; } else { same = 0; }
        }
    };

    action store_o() { meta.offset_match = store_offset.execute(meta.cell); }
    action store_r() { meta.rest_match = store_rest.execute(meta.cell); }
    action match_o() { meta.offset_match = match_offset.execute(meta.cell); }
    action match_r() { meta.rest_match = match_rest.execute(meta.cell); }

    apply {
        meta.seen = meta.old_bitmap & meta.mine;
        if (meta.old_bitmap == 0) {
            store_o();
            store_r();
        } else {
            match_o();
            match_r();
        }
    }
}

#endif
