/* What the worker port's two C files share: homagg/transport/_fastpath.c (one batch of datagrams
 * out or in: build + sendmmsg, recvmmsg + match) and homagg/transport/_fastround.c (the round's
 * protocol loop around them: window, fast retransmit, RTT samples, poll).
 */
#ifndef HOMAGG_FASTPATH_H
#define HOMAGG_FASTPATH_H

#include <stdint.h>

#define HDR 20  /* homagg/wire.py HEADER_LEN */

/* Job constants shared by both calls. */
typedef struct {
    int64_t seq0;          /* global number of the round's chunk 0 */
    int32_t nslot, slot_base, job_id, rank, version;
    uint32_t token;
} hg_job;

/* A word source's payload writer (homagg/transport/_base.py WordSource.native_fill): words
 * [off, off + n) of its stream, big-endian, into dst. */
typedef void (*hg_fill_fn)(const void *ctx, uint8_t *dst, int64_t off, int64_t n);

/* A round's results hook (homagg/transport/_base.py OwnRound.run's ``on_results``): called by the C
 * round loop after each batch of results it took (once the window was refilled), with the round's
 * outputs, its chunk table (stream, off, wc of its ``total`` chunks), the chunks completed so far, and
 * whether stream 0 was verified (it completed and its check passed: the loop returns to Python
 * before that otherwise).  It may read the completed chunks' results; it writes none of the
 * round's arrays.  A round the C loop does not run (the Python datapath) never calls it. */
typedef void (*hg_results_fn)(void *ctx, int32_t *const *out, const int32_t *stream, const int32_t *off,
                              const int32_t *wc, const uint8_t *completed, int64_t total, int64_t verified);

/* The round's chunk table: chunk c is words [off[c], off[c] + wc[c]) of stream stream[c], op op[c]. */
typedef struct {
    const int32_t *stream, *off, *wc, *op;
    const int32_t *const *src;  /* per stream: the words to send (host order) */
    int32_t *const *out;        /* per stream: where the results go (host order) */
    const hg_fill_fn *fill;     /* per stream: NULL, or the function that writes its payloads (src unused) */
    const void *const *fill_ctx;/* ... and its context */
    hg_results_fn on_results;   /* NULL, or the round's results hook (above) */
    void *results_ctx;          /* ... and its context */
} hg_chunks;

/* Counts of one homagg_fp_recv call besides the matched results. */
typedef struct {
    int64_t ignored;   /* not a result of this job (another job's, wrong token, malformed, ...) */
    int64_t probes;    /* the result group's probes (payload starts with the probe prefix) */
    int64_t late;      /* a valid result of this job for no outstanding chunk (late copy) */
    int64_t err;       /* errno of a failed receive other than EAGAIN (0: none) */
    int64_t drained;   /* 1: the socket had nothing more (the call stopped at EAGAIN) */
    int64_t overflow;  /* results of a coalesced buffer beyond max_events: dropped (retransmitted) */
} hg_recv_counts;

int64_t homagg_fp_send(int fd, const hg_job *job, const hg_chunks *ch, const int64_t *ids, int64_t n,
                       uint8_t *bufs, int64_t stride, int32_t *gso);
int64_t homagg_fp_recv(int fd, const hg_job *job, const hg_chunks *ch, int64_t total, int64_t *cur,
                       uint8_t *completed, int64_t *events, int64_t max_events, int64_t *late,
                       int64_t *nlate, uint8_t *rbuf, int64_t stride, const uint8_t *probe, int64_t probe_len,
                       hg_recv_counts *counts);

#endif
