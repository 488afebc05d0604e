/* homagg: lossless in-network gradient aggregation, P4_16 for v1model (BMv2 simple_switch_grpc).
 *
 * This top file only includes.  The pipeline is laid out like SwitchML's and like the Python switch
 * emulator (switch_emulator/), block by block:
 *
 *   parser.p4        Ethernet / IPv4 / UDP(dst 18497) / homagg header / 1..32 x int32 words
 *   state.p4         registers: per (slot, bank) cell worker bitmap, count, key, 32 words
 *   admission.p4     (dst ip) is the switch's; (src ip, src port) -> job, worker, job config
 *   slot_select.p4   slot inside the job's range; register cell = 2*slot + bank
 *   worker_bitmap.p4 verdict FIRST / ADD / ANSWER / DUPLICATE / STALE / CONFLICT
 *   counter.p4       completion count per cell; complete when it reaches the job's worker count
 *   tree.p4          trees (docs/trees.md): a child sends a completed use up to its parent and
 *                    passes the parent's result down to its workers (per-cell down bit)
 *   combine.p4       first write, then ADD (wrapping) / OR / MAX (signed) into the cell's words
 *   replicate.p4     multicast the result to the job's workers, or unicast a stored result to a
 *                    worker that retransmitted into a completed cell; egress rewrites addresses
 *   forward.p4       ordinary L2 forwarding for everything else (ARP, ping, ...)
 *   deparser.p4      emits headers, recomputes the IPv4 checksum
 *   ingress.p4       chains the blocks above in this order
 *
 * The wire format is docs/wire-format.md (homagg/wire.py); tests/test_p4_constants.py proves that
 * configuration.p4 and headers.p4 agree with homagg/wire.py.
 */
#include <core.p4>
#include <v1model.p4>

#include "configuration.p4"
#include "headers.p4"
#include "metadata.p4"
#include "parser.p4"
#include "state.p4"
#include "admission.p4"
#include "slot_select.p4"
#include "worker_bitmap.p4"
#include "counter.p4"
#include "tree.p4"
#include "combine.p4"
#include "replicate.p4"
#include "forward.p4"
#include "deparser.p4"
#include "ingress.p4"

V1Switch(HomaggParser(),
         HomaggVerifyChecksum(),
         HomaggIngress(),
         HomaggEgress(),
         HomaggComputeChecksum(),
         HomaggDeparser()) main;
