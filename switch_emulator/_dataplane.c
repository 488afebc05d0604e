/* The emulator's native data plane: the pipeline of switch_emulator/pipeline.py in C, with
 * batched syscalls (recvmmsg in, sendmmsg out) and no Python per datagram.
 *
 * Plain C, no Python API, loaded with ctypes by switch_emulator/native.py, which owns every array
 * this code reads and writes (numpy) and rebuilds the tables between calls of hg_serve; the
 * control plane (jobs, admission, counters, the control port) stays in Python.  The stages and
 * their order are pipeline.py's, verdict for verdict and counter for counter:
 *
 *   parse (short, version, op, length) -> a result (FLAG_RESULT) goes to result_down, the rest
 *   to admission (unknown_source, admission_mismatch, token, word_count) -> slot (slot_range) ->
 *   worker bitmap (FIRST, ADD, ANSWER, DUPLICATE, STALE, CONFLICT; bitmap.py) -> combine (ADD
 *   wraps, OR, signed MAX; combine.py) -> completion (completion.py) -> replication
 *   (replication.py: one copy to the job's multicast group for subscribed workers, worker_id 0;
 *   one unicast per other registered worker; ANSWER: a unicast of the stored result to that worker).
 *
 * Trees (docs/trees.md, the state table): a job with a parent (parent_port != 0) is a *child*.  A
 * use completing there goes up to the parent (flags 0, worker_id = child_id: counter up); an
 * ANSWER while the cell's ``down`` is 0 goes up again flagged FLAG_RETRANSMIT (retransmit_up);
 * a FIRST clears ``down``.  A FLAG_RESULT datagram is looked up by (source, job id) among the
 * jobs' parents (result_flag when none), then token, word_count, slot_range, and stale_result
 * unless the cell's use is that use, complete and not yet down; then the cell takes the words,
 * ``down`` := 1 and the result goes to the members as a root's completion does (result_down).
 * Output: _dpsend.h (the batch's datagrams, GSO-grouped per destination and length; a child's up
 * packets all go to one destination, its parent).
 *
 * tests/test_emulator_native.py and tests/test_tree_emulator.py feed the same datagrams through
 * both engines and compare every result byte and every counter.  Wire format: homagg/wire.py
 * (20-byte big-endian header, then big-endian int32 words).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "_udpseg.h"
#include "_wirewords.h"
#include "_dpsend.h"

#define HDR HG_HDR
#define VERSION 2
#define FLAG_RESULT 0x01
#define FLAG_RETRANSMIT 0x02
#define POISON ((int32_t)-1) /* bitmap.POISON: the offset of a poisoned use */

/* counter indices: switch_emulator/native.py names them in this order (hg_counter_names) */
enum { C_RX, C_TX, C_ACCEPTED, C_COMPLETED, C_ANSWERED, C_UP, C_RETRANSMIT_UP, C_RESULT_DOWN, D_SHORT, D_VERSION,
       D_OP, D_LENGTH, D_RESULT_FLAG, D_STALE_RESULT, D_UNKNOWN_SOURCE, D_ADMISSION_MISMATCH, D_TOKEN,
       D_WORD_COUNT, D_SLOT_RANGE, D_DUPLICATE, D_STALE, D_CONFLICT, N_COUNTERS };
static const char COUNTER_NAMES[] =
    "rx,tx,accepted,completed,retransmit_answered,up,retransmit_up,result_down,drop_short,drop_version,"
    "drop_op,drop_length,drop_result_flag,drop_stale_result,drop_unknown_source,drop_admission_mismatch,"
    "drop_token,drop_word_count,drop_slot_range,drop_duplicate,drop_stale,drop_conflict";

enum { FIRST, ADD, ANSWER, DUPLICATE, STALE, CONFLICT };

typedef struct {          /* one admitted source (ip, port in network order) */
    uint32_t ip;
    uint32_t port;
    int32_t job;          /* index into the job array */
    int32_t worker_id;
} hg_src;

typedef struct {
    int32_t job_id, world, slot_base, n_slots, k;
    uint32_t token;
    int32_t *regs;        /* [2 * n_slots][k] */
    uint32_t *bitmap;     /* [2 * n_slots] */
    int32_t *count;       /* [2 * n_slots] */
    int32_t *key;         /* [2 * n_slots][5]: set, tag, offset, op, word_count */
    uint8_t *down;        /* [2 * n_slots]: the parent's result of the use is in regs (a child) */
    uint32_t *addr_ip;    /* [world] network order; addr_port 0: not registered */
    uint32_t *addr_port;
    uint32_t subscribed;
    uint32_t group_ip, group_port;  /* group_port 0: no group */
    uint32_t parent_ip, parent_port; /* network order; parent_port 0: the root (no parent) */
    int32_t child_id;     /* the worker id at the parent */
    int64_t packets, completed, results;  /* since the last sync: admitted packets, uses, results down */
} hg_job;

static inline uint32_t get16(const uint8_t *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static inline uint32_t get32(const uint8_t *p) { uint32_t b; memcpy(&b, p, 4); return __builtin_bswap32(b); }
static inline void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void put32(uint8_t *p, uint32_t v) { uint32_t b = __builtin_bswap32(v); memcpy(p, &b, 4); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Queue cell i of job j (its key, its payload ``pay``, written once and shared by the copies)
 * to (ip, port) with ``flags`` and worker_id ``wid``: a result (FLAG_RESULT) or an up packet. */
static void out(outq *q, const hg_job *j, int i, uint32_t flags, uint32_t wid, uint32_t ip, uint32_t port,
                const uint8_t *pay, int64_t *c) {
    int m = q->n++;
    const int32_t *key = j->key + 5 * i;
    uint8_t *h = q->hdr[m];
    h[0] = (uint8_t)((VERSION << 4) | (key[3] & 0xF));
    h[1] = (uint8_t)flags;
    put16(h + 2, (uint32_t)j->job_id);
    h[4] = (uint8_t)wid;
    h[5] = 0;
    put16(h + 6, (uint32_t)key[4]);
    put16(h + 8, ((uint32_t)(i & 1) << 15) | (uint32_t)(j->slot_base + (i >> 1)));
    put16(h + 10, (uint32_t)key[1]);
    put32(h + 12, (uint32_t)key[2]);
    put32(h + 16, j->token);
    q->iov[m][0].iov_base = h;
    q->iov[m][0].iov_len = HDR;
    q->iov[m][1].iov_base = (void *)pay;
    q->iov[m][1].iov_len = 4 * (size_t)key[4];
    memset(&q->dst[m], 0, sizeof q->dst[m]);
    q->dst[m].sin_family = AF_INET;
    q->dst[m].sin_addr.s_addr = ip;
    q->dst[m].sin_port = (uint16_t)port;
    memset(&q->msgs[m].msg_hdr, 0, sizeof q->msgs[m].msg_hdr);
    q->msgs[m].msg_hdr.msg_name = &q->dst[m];
    q->msgs[m].msg_hdr.msg_namelen = sizeof q->dst[m];
    q->msgs[m].msg_hdr.msg_iov = q->iov[m];
    q->msgs[m].msg_hdr.msg_iovlen = 2;
    c[C_TX]++;
}

static const uint8_t *payload(outq *q, const hg_job *j, int i) {
    uint8_t *p = q->payloads + (int64_t)q->npay++ * STRIDE;
    const int32_t *r = j->regs + (int64_t)i * j->k;
    int32_t wc = j->key[5 * i + 4];
    hg_words_to_wire(p, r, wc);
    return p;
}

/* replication.multicast: the cell's result to the job's members (group copy + unicasts) */
static void multicast(outq *q, const hg_job *j, int i, int64_t *c) {
    const uint8_t *pay = payload(q, j, i);
    uint32_t sub = j->subscribed;
    if (sub && j->group_port)
        out(q, j, i, FLAG_RESULT, 0, j->group_ip, j->group_port, pay, c);
    for (int32_t x = 0; x < j->world; x++) {
        if (!j->addr_port[x] || (sub >> x & 1))
            continue;
        out(q, j, i, FLAG_RESULT, (uint32_t)x, j->addr_ip[x], j->addr_port[x], pay, c);
    }
}

/* replication.up: the cell's combined words to the parent as worker child_id's contribution */
static void up(outq *q, const hg_job *j, int i, int retransmit, int64_t *c) {
    out(q, j, i, retransmit ? FLAG_RETRANSMIT : 0, (uint32_t)j->child_id, j->parent_ip, j->parent_port,
        payload(q, j, i), c);
}

/* pipeline._result_down: a result from the job's parent (the header's fields already read) */
static void result_down(const uint8_t *b, uint32_t sip, uint32_t sport, hg_job *jobs, int njobs, uint32_t op,
                        uint32_t wc, int64_t *c, outq *q) {
    int32_t job_id = (int32_t)get16(b + 2);
    hg_job *j = NULL;
    for (int k = 0; k < njobs; k++)
        if (jobs[k].parent_port && jobs[k].parent_ip == sip && jobs[k].parent_port == sport
            && jobs[k].job_id == job_id) { j = &jobs[k]; break; }
    if (j == NULL) { c[D_RESULT_FLAG]++; return; }
    if (get32(b + 16) != j->token) { c[D_TOKEN]++; return; }
    if ((int32_t)wc > j->k) { c[D_WORD_COUNT]++; return; }
    uint32_t bs = get16(b + 8), slot = bs & 0x7FFF, bank = bs >> 15;
    int32_t rel = (int32_t)slot - j->slot_base;
    if (rel < 0 || rel >= j->n_slots) { c[D_SLOT_RANGE]++; return; }
    int i = 2 * rel + (int)bank;
    const int32_t *key = j->key + 5 * i;
    int same = key[0] && key[1] == (int32_t)get16(b + 10) && key[2] == (int32_t)get32(b + 12)
               && key[3] == (int32_t)op && key[4] == (int32_t)wc;
    if (!same || j->count[i] != j->world || j->down[i]) { c[D_STALE_RESULT]++; return; }
    j->results++;
    j->down[i] = 1;
    hg_words_from_wire(j->regs + (int64_t)i * j->k, b + HDR, wc);
    c[C_RESULT_DOWN]++;
    multicast(q, j, i, c);
}

static void process(const uint8_t *b, int64_t n, uint32_t sip, uint32_t sport, const hg_src *srcs, int nsrc,
                    hg_job *jobs, int njobs, int64_t *c, outq *q) {
    c[C_RX]++;
    if (n < HDR) { c[D_SHORT]++; return; }
    uint32_t version = b[0] >> 4, op = b[0] & 0xF, flags = b[1];
    if (version != VERSION) { c[D_VERSION]++; return; }
    if (op > 2) { c[D_OP]++; return; }
    uint32_t wc = get16(b + 6);
    if (wc == 0 || n != HDR + 4 * (int64_t)wc) { c[D_LENGTH]++; return; }
    if (flags & FLAG_RESULT) { result_down(b, sip, sport, jobs, njobs, op, wc, c, q); return; }
    const hg_src *s = NULL;
    for (int k = 0; k < nsrc; k++)
        if (srcs[k].ip == sip && srcs[k].port == sport) { s = &srcs[k]; break; }
    if (s == NULL) { c[D_UNKNOWN_SOURCE]++; return; }
    hg_job *j = &jobs[s->job];
    if ((int32_t)get16(b + 2) != j->job_id || (int32_t)b[4] != s->worker_id) { c[D_ADMISSION_MISMATCH]++; return; }
    if (get32(b + 16) != j->token) { c[D_TOKEN]++; return; }
    if ((int32_t)wc > j->k) { c[D_WORD_COUNT]++; return; }
    j->packets++;
    uint32_t bs = get16(b + 8), slot = bs & 0x7FFF, bank = bs >> 15;
    int32_t rel = (int32_t)slot - j->slot_base;
    if (rel < 0 || rel >= j->n_slots) { c[D_SLOT_RANGE]++; return; }
    int i = 2 * rel + (int)bank;
    int32_t tag = (int32_t)get16(b + 10), off = (int32_t)get32(b + 12);
    int32_t *key = j->key + 5 * i;
    /* bitmap.check and bitmap.update: same use = (tag, op, wc); ok = same offset, not POISON */
    int same = key[0] && key[1] == tag && key[3] == (int32_t)op && key[4] == (int32_t)wc;
    int ok = same && key[2] == off && off != POISON;
    uint32_t w = (uint32_t)s->worker_id, bit = 1u << w, bm = j->bitmap[i];
    int32_t cnt = j->count[i];
    int done = cnt == 0 || cnt == j->world, seen = (bm & bit) != 0, verdict;
    if (!same)
        verdict = done ? FIRST : seen ? DUPLICATE : CONFLICT;
    else if (seen)
        verdict = cnt == j->world && ok ? ((flags & FLAG_RETRANSMIT) ? ANSWER : STALE) : DUPLICATE;
    else
        verdict = ok ? ADD : CONFLICT;
    if (!same) {
        if (done) {
            j->bitmap[i] = bit;
            j->count[i] = 1;
            key[0] = 1; key[1] = tag; key[2] = off; key[3] = (int32_t)op; key[4] = (int32_t)wc;
        }
    } else {
        if (!seen) {
            j->bitmap[i] = bm | bit;
            j->count[i] = cnt + 1;
        }
        if (!done && key[2] != off)
            key[2] = POISON;   /* the same use with another offset: it never completes nor answers */
    }
    if (verdict > ADD) {
        if (verdict == ANSWER && j->parent_port && !j->down[i]) {
            c[C_RETRANSMIT_UP]++;  /* the result has not come down: ask the parent again */
            up(q, j, i, 1, c);
        } else if (verdict == ANSWER) {
            c[C_ANSWERED]++;
            if (j->addr_port[w])
                out(q, j, i, FLAG_RESULT, w, j->addr_ip[w], j->addr_port[w], payload(q, j, i), c);
            else
                c[C_TX]++;  /* pipeline.py counts tx for an answer even when the worker has no address */
        } else if (verdict == DUPLICATE) {
            c[D_DUPLICATE]++;
        } else if (verdict == STALE) {
            c[D_STALE]++;
        } else {
            c[D_CONFLICT]++;
        }
        return;
    }
    int first = verdict == FIRST;
    c[C_ACCEPTED]++;
    if (first)
        j->down[i] = 0;
    int32_t *r = j->regs + (int64_t)i * j->k;
    const uint8_t *p = b + HDR;
    if (first)
        hg_words_from_wire(r, p, wc);
    else if (op == 0)
        hg_words_add(r, p, wc);
    else if (op == 1)
        hg_words_or(r, p, wc);
    else
        hg_words_max(r, p, wc);
    if (j->count[i] != j->world)   /* completion.complete */
        return;
    j->completed++;
    c[C_COMPLETED]++;
    if (j->parent_port) {
        c[C_UP]++;
        up(q, j, i, 0, c);
        return;
    }
    multicast(q, j, i, c);
}

/* Serve ``fd`` for at most ``max_s`` seconds: receive batches, run them through the pipeline, send
 * the results.  Returns early (after finishing the batch in hand) when ``*dirty`` is set (the
 * control plane changed the tables) or the socket stayed idle for ``idle_s``.  ``rbuf``: BATCH x
 * STRIDE bytes; ``payloads``: BATCH x STRIDE bytes.  Returns the datagrams processed, or -1 when
 * the socket is unusable (closed: EBADF, ENOTSOCK): the caller stops serving.  ``srcs`` index
 * ``jobs[0 .. njobs)``; a result's job is found by its parent address (see result_down). */
int64_t hg_serve(int fd, const hg_src *srcs, int32_t nsrc, hg_job *jobs, int32_t njobs, int64_t *counters,
                 double max_s, double idle_s, volatile int32_t *dirty, uint8_t *rbuf, uint8_t *payloads, void *scratch) {
    outq *q = (outq *)scratch;
    q->n = 0;
    q->npay = 0;
    q->payloads = payloads;
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    struct sockaddr_in from[BATCH];
    hg_segctl ctl[BATCH];
    double t0 = now_s(), deadline = t0 + max_s;
    int64_t total = 0;
    while (!*dirty) {
        for (int i = 0; i < BATCH; i++) {
            iov[i].iov_base = rbuf + (int64_t)i * STRIDE;
            iov[i].iov_len = STRIDE;
            memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
            msgs[i].msg_hdr.msg_name = &from[i];
            msgs[i].msg_hdr.msg_namelen = sizeof from[i];
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            hg_gro_prepare(&msgs[i].msg_hdr, &ctl[i]);
        }
        int got = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (got <= 0) {
            if (got < 0 && (errno == EBADF || errno == ENOTSOCK || errno == EFAULT || errno == EINVAL))
                return -1;  /* the socket is gone (closed under us): never spin on it */
            double t = now_s();
            if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                if (t >= deadline)
                    break;
                continue;  /* e.g. an ICMP error reported on the socket: ignore, as io_udp.py does */
            }
            if (t >= deadline)
                break;
            double wait = idle_s < deadline - t ? idle_s : deadline - t;
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, (int)(wait * 1000) + 1) <= 0)
                break;  /* idle: back to Python (fault flush, housekeeping) */
            continue;
        }
        for (int i = 0; i < got; i++) {
            /* a coalesced buffer (UDP_GRO) is datagrams of ``seg`` bytes back to back */
            const int64_t len = msgs[i].msg_len, gro = hg_gro_size(&msgs[i].msg_hdr);
            const int64_t seg = gro > 0 && gro < len ? gro : len;
            for (int64_t at = 0; at < len || (len == 0 && at == 0); at += seg > 0 ? seg : 1) {
                if (q->npay >= BATCH || q->n > MAX_COPIES - (MAX_WORKERS + 1))
                    flush(fd, q);  /* room for one more datagram's results */
                total++;
                if (from[i].sin_family != AF_INET) { counters[C_RX]++; counters[D_UNKNOWN_SOURCE]++; continue; }
                process(rbuf + (int64_t)i * STRIDE + at, len - at < seg ? len - at : seg, from[i].sin_addr.s_addr,
                        from[i].sin_port, srcs, nsrc, jobs, njobs, counters, q);
            }
        }
        flush(fd, q);
        if (now_s() >= deadline)
            break;
    }
    return total;
}

int64_t hg_scratch_size(void) { return (int64_t)sizeof(outq); }
int32_t hg_n_counters(void) { return N_COUNTERS; }
const char *hg_counter_names(void) { return COUNTER_NAMES; }
