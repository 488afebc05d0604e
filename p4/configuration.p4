/* configuration.p4: sizes and wire constants.
 *
 * Every constant marked [wire] mirrors homagg/wire.py (tests/test_p4_constants.py compares them);
 * the others size this program's tables and registers.
 */
#ifndef HOMAGG_CONFIGURATION_P4
#define HOMAGG_CONFIGURATION_P4

/* ---- wire format (docs/wire-format.md) ---- */
const bit<4>  HOMAGG_VERSION    = 2;       /* [wire] VERSION */
const bit<4>  OP_ADD            = 0;       /* [wire] wrapping int32 addition */
const bit<4>  OP_OR             = 1;       /* [wire] bitwise or */
const bit<4>  OP_MAX            = 2;       /* [wire] signed int32 maximum */
const bit<8>  FLAG_RESULT       = 0x01;    /* [wire] switch -> worker */
const bit<8>  FLAG_RETRANSMIT   = 0x02;    /* [wire] worker resent after a timeout */
const bit<16> HOMAGG_UDP_PORT   = 18497;   /* [wire] 0x4841 "HA" */
const bit<16> HEADER_LEN        = 20;      /* [wire] homagg header bytes */
const bit<16> P4_WORDS          = 32;      /* [wire] K: int32 payload words per packet */
const bit<32> MAX_WORKERS       = 32;      /* [wire] worker bitmap width */
const bit<32> MAX_SLOTS         = 32768;   /* [wire] 2**15: slot field width */

/* ---- resources of this program ---- */
const bit<32> SLOT_POOL_SIZE    = 1024;    /* slots in the switch's pool (jobs own ranges of it) */
const bit<32> POOL_CELLS        = 2048;    /* = 2 * SLOT_POOL_SIZE: one cell per (slot, bank) */
const bit<32> ADMISSION_ENTRIES = 4096;    /* admitted worker source addresses, all jobs */
const bit<32> FORWARD_ENTRIES   = 1024;    /* L2 forwarding table size */

/* ---- results leave the switch with these header values ---- */
const bit<8>  RESULT_TTL        = 64;
const bit<3>  RESULT_IP_FLAGS   = 0b010;   /* don't fragment */

/* ---- protocol numbers ---- */
const bit<16> ETHERTYPE_IPV4    = 0x0800;
const bit<8>  IPPROTO_UDP       = 17;

/* ---- verdicts of the worker bitmap stage (switch_emulator/bitmap.py) ---- */
const bit<8>  VERDICT_FIRST     = 0;       /* first contribution of a new use of the (slot, bank) */
const bit<8>  VERDICT_ADD       = 1;       /* a further contribution to the use in progress */
const bit<8>  VERDICT_ANSWER    = 2;       /* already counted, use complete: unicast the result */
const bit<8>  VERDICT_DUPLICATE = 3;       /* already counted, use not complete: drop */
const bit<8>  VERDICT_STALE     = 4;       /* late copy of a completed use: drop */
const bit<8>  VERDICT_CONFLICT  = 5;       /* new contribution whose key differs: drop */
const bit<32> POISON_OFFSET     = 0xFFFFFFFF; /* a poisoned use's offset; never a packet's (bitmap.POISON) */

/* ---- drop reasons: index of the drop_reasons counter; names as the emulator's drop_<reason> ---- */
const bit<32> DROP_NONE               = 0;
const bit<32> DROP_VERSION            = 1;
const bit<32> DROP_OP                 = 2;
const bit<32> DROP_LENGTH             = 3;   /* word_count 0, lengths disagree, or payload cut short */
const bit<32> DROP_RESULT_FLAG        = 4;
const bit<32> DROP_UNKNOWN_SOURCE     = 5;
const bit<32> DROP_ADMISSION_MISMATCH = 6;   /* header job/worker differ from the admitted source */
const bit<32> DROP_WORD_COUNT         = 7;   /* more words than the job was admitted with (or > P4_WORDS) */
const bit<32> DROP_SLOT_RANGE         = 8;
const bit<32> DROP_DUPLICATE          = 9;
const bit<32> DROP_STALE              = 10;
const bit<32> DROP_CONFLICT           = 11;
const bit<32> DROP_CONSUMED           = 12;  /* not an error: absorbed, use not complete yet */
const bit<32> DROP_SHORT              = 13;  /* UDP payload shorter than the homagg header */
const bit<32> DROP_TOKEN              = 14;  /* admitted source, but not the job's admission token */
const bit<32> DROP_STALE_RESULT       = 15;  /* trees: a result from the parent for a use not waiting for it */
const bit<32> DROP_REASONS            = 16;  /* size of the drop_reasons counter */

/* ---- trees (docs/trees.md): index of the tree_events counter; names as the emulator's counters ---- */
const bit<32> TREE_UP                 = 0;   /* a completed use sent up to the parent (child) */
const bit<32> TREE_RETRANSMIT_UP      = 1;   /* a retransmission answered by sending the use up again, flagged */
const bit<32> TREE_RESULT_DOWN        = 2;   /* a result from the parent written and sent to the members */
const bit<32> TREE_EVENTS             = 3;   /* size of the tree_events counter */

/* Multicast groups: the job's result group is chosen by the controller (one per job);
 * FLOOD_GROUP replicates broadcast frames (ARP) to every port.  PI (the P4Runtime server) accepts
 * group ids 1 .. 2^15 - 1 only (it reserves the upper half). */
const bit<16> FLOOD_GROUP       = 0x7FFF;

/* ---- compile-time checks; they also read the [wire] constants the pipeline does not otherwise
 * use (p4c warns about unused constants, and the build runs with --Werror) ---- */
const bool CHECK_POOL_CELLS = static_assert(POOL_CELLS == 2 * SLOT_POOL_SIZE, "POOL_CELLS = 2 * SLOT_POOL_SIZE");
const bool CHECK_POOL_SLOTS = static_assert(SLOT_POOL_SIZE <= MAX_SLOTS, "the pool fits the 15-bit slot field");
const bool CHECK_WORKERS    = static_assert(MAX_WORKERS == 32, "worker bitmaps are bit<32>");
const bool CHECK_FLAGS      = static_assert((FLAG_RESULT & FLAG_RETRANSMIT) == 0, "flags are distinct bits");
const bool CHECK_DROPS      = static_assert(DROP_STALE_RESULT < DROP_REASONS, "drop reasons fit the counter");
const bool CHECK_TREE       = static_assert(TREE_UP < TREE_EVENTS && TREE_RETRANSMIT_UP < TREE_EVENTS
                                            && TREE_RESULT_DOWN < TREE_EVENTS, "tree events fit the counter");

#endif
