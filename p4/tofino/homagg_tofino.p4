/* homagg for Intel Tofino (TNA, Tofino 1) and Tofino 2 (T2NA): the same source serves both.
 *
 * This top file only includes.  Wire format, header types and shared constants are the v1model
 * program's own files (../configuration.p4, ../headers.p4, ../words.p4), not copies; what only
 * this target needs is in tofino_config.p4 and metadata.p4 here.  Block by block, as the v1model
 * program and the emulator (docs/p4-tofino.md has the differences and why):
 *
 *   parser.p4        ingress: Ethernet / IPv4 / UDP(18497) / homagg / 1..TOFINO_WORDS words
 *                    (one state per word, no loop); egress: bridge + headers up to homagg
 *   admission.p4     service address, header checks, source -> job, worker; worker bit; slot range;
 *                    trees: (source, job) -> the job's parent, whose results come down
 *   worker_bitmap.p4 per cell a pair (missing workers, tag ++ op ++ word_count): mark or start a use
 *   use_key.p4       per cell a pair (offset, key copy): store on FIRST, else compare (poison)
 *   counter.p4       verdicts FIRST / ADD / STALE / ANSWER / DUPLICATE / CONFLICT, and on a result
 *                    from the parent RESULT_DOWN / STALE_RESULT; per cell the down bit (trees)
 *   combine.p4       one register per word, 4 RegisterActions: first-or-ADD, first-or-OR,
 *                    first-or-MAX, read
 *   replicate.p4     multicast to the job's group, unicast answers, up to the parent (trees), drop
 *                    and tree_events counters; egress rewrite (to a worker, to the parent)
 *   forward.p4       L2 forwarding for everything else
 *   deparser.p4      ingress and egress deparsers, IPv4 checksum of results
 *   pipeline.p4      the ingress and egress controls chaining the blocks
 *
 * Per job a switch is the root (today's one-switch job) or a child of a tree (docs/trees.md): the
 * BF Runtime writer (homagg/p4/bfrt.py) sets admission's child bit and the parent's entries; the
 * same program, the same words per pass, serves both roles.
 */
#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>
#else
#include <tna.p4>
#endif

#include "../configuration.p4"
#include "../headers.p4"
#include "../words.p4"
#include "tofino_config.p4"
#include "metadata.p4"
#include "parser.p4"
#include "admission.p4"
#include "worker_bitmap.p4"
#include "use_key.p4"
#include "counter.p4"
#include "combine.p4"
#include "replicate.p4"
#include "forward.p4"
#include "deparser.p4"
#include "pipeline.p4"

Pipeline(HomaggIngressParser(),
         HomaggIngress(),
         HomaggIngressDeparser(),
         HomaggEgressParser(),
         HomaggEgress(),
         HomaggEgressDeparser()) pipe;

Switch(pipe) main;
