/* The worker port's round loop in C: homagg_fp_run advances one round of self-clocked chunks
 * (homagg/transport/_udp.py's protocol) without returning to Python per batch of results.
 *
 * Python (homagg/transport/_udp.py, UdpSwitchPort._run_native) keeps what runs rarely: the timer
 * scan (expired chunks, the stall probe, backoff), the liveness check, the progress timeout, the
 * early verification of stream 0 and every error.  This loop does what runs per result, exactly as
 * the Python reference loop (UdpSwitchPort._run_python) does it, step for step:
 *
 *   receive (unicast socket, then the result group), count late copies (a second copy of a
 *   retransmitted chunk's result proves the retransmission spurious: the window's last cut is
 *   undone), then per completed chunk c in arrival order: stream 0's countdown, one RTT sample per
 *   batch (its first chunk sent once: Karn), the slot's last chunk, the lowest incomplete chunk,
 *   window growth, fast retransmit of chunks overtaken by more than DUPTHRESH later results; then
 *   fill the window; poll, and drain only the sockets the poll found something on.
 *
 * It returns HG_RUN_DONE (every chunk completed), HG_RUN_VERIFY (stream 0 just completed: Python
 * verifies it, then calls again; with ``agree_words`` only where the agreement check below fails), HG_RUN_SCAN (the monotonic clock reached ``until``) or -errno.
 * The RTO used for new deadlines is the one Python passed in (its estimator takes the samples of
 * ``samples[]`` on return): ``until`` is at most a few milliseconds away, so it is never stale
 * for longer.  Invariants: those of homagg_fp_send/homagg_fp_recv; every state field below is
 * Python's to read and write between calls (homagg/transport/_fastpath.py mirrors the struct).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "_fastpath.h"

#define FLAG_RETRANSMIT 0x02
#define DUPTHRESH 3       /* homagg/transport/_udp.py DUPTHRESH */
#define MAX_SAMPLES 64

enum { HG_RUN_DONE = 0, HG_RUN_VERIFY = 1, HG_RUN_SCAN = 2 };

/* Per-slot state shared with Python (arrays of n_slots). */
typedef struct {
    int64_t *cur;       /* chunk outstanding in the slot, -1 if none */
    int32_t *tries;     /* retransmissions of it */
    double *sent_at;    /* first send (monotonic s) */
    double *deadline;   /* when its timer expires */
    int64_t *last_g;    /* global number of the slot's last completed chunk (-1: none) */
    uint8_t *last_retx; /* ... whether it had been retransmitted */
} hg_slots;

/* The round's protocol state and counts (homagg/transport/_fastpath.py _RoundState). */
typedef struct {
    double cwnd, ssthresh, floor, limit;          /* homagg/transport/_window.py CongestionWindow */
    double before_cwnd, before_ssthresh;
    int64_t has_before, recover, reductions, undos;
    double rto, max_rto;                          /* homagg/transport/_rto.py (read only here) */
    int64_t total, low, fr_next, nsent, done, n0, verify_left, backlog;
    double last_progress;
    int64_t packets, retransmits, fast_retransmits, spurious, results, send_stalls, refused, late;
    int64_t nsamples;
    double samples[MAX_SAMPLES];                  /* RTT samples since the last return */
    double next_scan;                             /* homagg_fp_round: the round's first timer scan */
    int64_t win_changed;                          /* the window's state changed since the last return */
    int64_t rare;                                 /* a count besides packets/results, or win_changed */
    int64_t agree_words;  /* > 0: stream 0's verifier is an agreement of this many fields (_base.py
                           * AgreementCheck): checked here, Python called only where it fails */
    int64_t agreed;       /* set when that check passed (Python counts it as the verifier's call) */
} hg_round;

/* Buffers of the round: scratch arrays of homagg/transport/_fastpath.py Scratch. */
typedef struct {
    uint8_t *bufs;          /* slot datagrams, ``stride`` bytes apart */
    int64_t stride;
    uint8_t *rbuf;          /* receive buffers, ``rstride`` bytes apart */
    int64_t rstride;
    int64_t *events, max_events, *late, *ids;  /* events: room for 2 * max_events (one per socket) */
    const uint8_t *probe;
    int64_t probe_len;
    int32_t *gso;
} hg_bufs;

/* Whether stream 0's combined words agree: word i is the MAX of a field, word n + i the MAX of its
 * complement, so every rank sent the same field exactly when word i == ~word (n + i). */
static int agrees(const int32_t *w, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (w[i] != ~w[n + i])
            return 0;
    return 1;
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);  /* Python's time.monotonic() */
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void win_on_result(hg_round *r) {
    double c = r->cwnd;
    if (c < r->limit) {
        double grown = c + (c < r->ssthresh ? 1.0 : 1.0 / c);
        r->cwnd = grown < r->limit ? grown : r->limit;
        r->win_changed = 1;
    }
}

static void win_on_loss(hg_round *r, int64_t lost, int64_t next_new) {
    if (lost < r->recover)
        return;
    r->before_cwnd = r->cwnd;
    r->before_ssthresh = r->ssthresh;
    r->has_before = 1;
    r->ssthresh = r->cwnd / 2 > r->floor ? r->cwnd / 2 : r->floor;
    r->cwnd = r->ssthresh;
    r->recover = next_new;
    r->reductions++;
    r->win_changed = 1;
}

static void win_on_spurious(hg_round *r) {
    if (!r->has_before)
        return;
    r->cwnd = r->cwnd > r->before_cwnd ? r->cwnd : r->before_cwnd;
    r->ssthresh = r->before_ssthresh;
    r->has_before = 0;
    r->undos++;
    r->win_changed = 1;
}

/* Resend slot s's datagram with FLAG_RETRANSMIT (a full buffer waits up to 50 ms once, then counts
 * as loss: homagg/transport/_sockets.py send_datagram).  0 or -errno. */
static int64_t resend(int fd, const hg_chunks *ch, hg_round *r, hg_slots *sl,
                      const hg_bufs *b, int64_t s, double now) {
    uint8_t *p = b->bufs + s * b->stride;
    size_t len = HDR + 4 * (size_t)ch->wc[sl->cur[s]];
    p[1] |= FLAG_RETRANSMIT;
    if (send(fd, p, len, MSG_DONTWAIT) < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pf = {fd, POLLOUT, 0};
            poll(&pf, 1, 50);
            (void)send(fd, p, len, MSG_DONTWAIT);
        } else if (errno == ECONNREFUSED) {
            r->refused++;
        } else {
            return -errno;
        }
    }
    sl->tries[s]++;
    r->retransmits++;
    double back = r->rto;
    for (int32_t i = 1; i < sl->tries[s] && back < r->max_rto; i++)
        back *= 2;
    sl->deadline[s] = now + (back < r->max_rto ? back : r->max_rto);
    return 0;
}

/* Send new chunks while the window allows; sets r->backlog when the socket's buffer had no room
 * for all of them.  0 or -errno. */
static int64_t fill(int fd, const hg_job *job, const hg_chunks *ch, hg_round *r, hg_slots *sl,
                    const hg_bufs *b, double now) {
    int64_t lim = r->low + (int64_t)r->cwnd;
    if (lim > r->total)
        lim = r->total;
    if (r->nsent >= lim) {
        r->backlog = 0;
        return 0;
    }
    int64_t n = lim - r->nsent;
    for (int64_t i = 0; i < n; i++) {
        int64_t c = r->nsent + i, s = (job->seq0 + c) % job->nslot;
        b->ids[i] = c;
        sl->cur[s] = c;
        sl->tries[s] = 0;
        sl->sent_at[s] = now;
        sl->deadline[s] = now + r->rto;
    }
    int64_t went = homagg_fp_send(fd, job, ch, b->ids, n, b->bufs, b->stride, b->gso);
    if (went < 0) {
        if (-went != ECONNREFUSED)
            return went;
        r->refused++;
        went = 0;
    }
    for (int64_t i = went; i < n; i++)  /* not sent: their slots stay free until the buffer drains */
        sl->cur[(job->seq0 + b->ids[i]) % job->nslot] = -1;
    r->nsent += went;
    r->packets += went;
    r->send_stalls += went < n;
    r->backlog = went < n;
    return 0;
}

/* A valid result of this job for no outstanding chunk (homagg/transport/_udp.py _late_result). */
static void late_result(const hg_job *job, hg_round *r, hg_slots *sl, int64_t s, int64_t tag, int64_t bank) {
    int64_t g = sl->last_g[s];
    r->late++;
    if (g >= 0 && sl->last_retx[s] && tag == (g & 0xFFFF) && bank == ((g / job->nslot) & 1)) {
        r->spurious++;
        sl->last_retx[s] = 0;
        win_on_spurious(r);
    }
}

/* Drain ``fd``: completed chunks appended to events[*nev .. limit), late copies handled.  0 or
 * -errno (ECONNREFUSED is counted, not returned). */
static int64_t drain(int fd, const hg_job *job, const hg_chunks *ch, hg_round *r, hg_slots *sl, uint8_t *completed,
                     const hg_bufs *b, int64_t *nev, int64_t limit, hg_recv_counts *counts) {
    while (*nev < limit) {
        int64_t nlate = 0;
        int64_t n = homagg_fp_recv(fd, job, ch, r->total, sl->cur, completed, b->events + *nev, limit - *nev,
                                   b->late, &nlate, b->rbuf, b->rstride, b->probe, b->probe_len, counts);
        *nev += n;
        for (int64_t i = 0; i < nlate; i++)
            late_result(job, r, sl, b->late[3 * i], b->late[3 * i + 1], b->late[3 * i + 2]);
        if (counts->err) {
            int64_t err = counts->err;
            counts->err = 0;
            if (err != ECONNREFUSED)
                return -err;
            r->refused++;
            return 0;
        }
        if (counts->drained)
            return 0;
    }
    return 0;
}

/* Run the round until it completes, stream 0 completes, or the clock reaches ``until``; see the
 * file comment.  ``mfd``: the result group's socket, -1 if none.  ``ready``: which sockets to drain
 * before the first poll (bit 0: fd, bit 1: mfd); afterwards a socket is drained only when ppoll
 * says it has something (data or an error): an empty socket's drain changes nothing, so this
 * makes the same decisions as draining both every time, with fewer syscalls. */
static int64_t run(int fd, int mfd, const hg_job *job, const hg_chunks *ch, hg_round *r, hg_slots *sl,
                   uint8_t *completed, const hg_bufs *b, hg_recv_counts *counts, double until, int ready) {
    int64_t rc;
    r->nsamples = 0;
    r->win_changed = 0;
    if (r->done >= r->total)
        return HG_RUN_DONE;
    if (r->backlog && (rc = fill(fd, job, ch, r, sl, b, mono())) < 0)
        return rc;
    for (;;) {
        int64_t nev = 0;  /* each socket gets max_events of room (events holds twice that), as in Python */
        if ((ready & 1) && (rc = drain(fd, job, ch, r, sl, completed, b, &nev, b->max_events, counts)) < 0)
            return rc;
        if (mfd >= 0 && (ready & 2)
            && (rc = drain(mfd, job, ch, r, sl, completed, b, &nev, nev + b->max_events, counts)) < 0)
            return rc;
        int verify_now = 0;
        double now = mono();
        if (nev) {
            double sampled = -1.0;  /* one RTT sample per batch (its oldest clean send), as TCP */
            for (int64_t e = 0; e < nev; e++) {
                int64_t c = b->events[e], g = job->seq0 + c, s = g % job->nslot;
                if (r->verify_left && c < r->n0 && --r->verify_left == 0)
                    verify_now = 1;  /* stream 0 is back: Python verifies it before anything else waits */
                if (sl->tries[s] == 0 && sampled < 0)  /* Karn: a retransmitted chunk's RTT is ambiguous */
                    sampled = now - sl->sent_at[s];
                sl->last_g[s] = g;
                sl->last_retx[s] = sl->tries[s] > 0;
                while (r->low < r->total && completed[r->low])
                    r->low++;
                win_on_result(r);
                if (c - DUPTHRESH > r->fr_next) {  /* fast retransmit of chunks overtaken by later results */
                    for (int64_t i = r->fr_next > r->low ? r->fr_next : r->low; i < c - DUPTHRESH; i++) {
                        int64_t si = (job->seq0 + i) % job->nslot;
                        if (sl->cur[si] == i && sl->tries[si] == 0) {
                            win_on_loss(r, job->seq0 + i, job->seq0 + r->nsent);
                            if ((rc = resend(fd, ch, r, sl, b, si, now)) < 0)
                                return rc;
                            r->fast_retransmits++;
                        }
                    }
                    r->fr_next = c - DUPTHRESH;
                }
            }
            if (sampled >= 0 && r->nsamples < MAX_SAMPLES)
                r->samples[r->nsamples++] = sampled;
            r->done += nev;
            r->results += nev;
            r->last_progress = now;
            if (verify_now && r->agree_words > 0 && agrees(ch->out[0], r->agree_words))
                r->agreed = 1;  /* the ranks agree: go on without returning */
            else if (verify_now) {  /* before anything more is sent, and even when the round is complete */
                r->backlog = 1;  /* the next call fills the window first */
                return HG_RUN_VERIFY;
            }
            if ((rc = fill(fd, job, ch, r, sl, b, now)) < 0)
                return rc;
            if (ch->on_results)  /* the window refilled first: the hook's work overlaps the chunks in flight */
                ch->on_results(ch->results_ctx, ch->out, ch->stream, ch->off, ch->wc, completed, r->total,
                               r->verify_left == 0);
        } else if (r->backlog) {
            if ((rc = fill(fd, job, ch, r, sl, b, now)) < 0)
                return rc;
        }
        if (r->done >= r->total)
            return HG_RUN_DONE;
        if (now >= until || r->nsamples >= MAX_SAMPLES)
            return HG_RUN_SCAN;
        struct pollfd pf[2] = {{fd, POLLIN | (r->backlog ? POLLOUT : 0), 0}, {mfd, POLLIN, 0}};
        double wait = until - now + 1e-4;
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        if (ppoll(pf, mfd >= 0 ? 2 : 1, &ts, NULL) < 0)
            ready = 3;  /* interrupted: look at both */
        else
            ready = ((pf[0].revents & ~POLLOUT) ? 1 : 0) | (mfd >= 0 && pf[1].revents ? 2 : 0);
    }
}

int64_t homagg_fp_run(int fd, int mfd, const hg_job *job, const hg_chunks *ch, hg_round *r, hg_slots *sl,
                      uint8_t *completed, const hg_bufs *b, hg_recv_counts *counts, double until) {
    return run(fd, mfd, job, ch, r, sl, completed, b, counts, until, 3);
}

/* homagg_fp_round's arguments, made once per round set-up (homagg/transport/_fastpath.py _Call). */
typedef struct {
    int64_t fd, mfd;
    const hg_job *job;
    const hg_chunks *ch;
    hg_round *r;
    hg_slots *sl;
    uint8_t *completed;
    const hg_bufs *b;
    hg_recv_counts *counts;
    double slice;  /* the longest one call runs (homagg/transport/_roundloop.py SCAN_SLICE_S) */
} hg_call;

/* One call of the small-round path (homagg/transport/_fastpath.py NativeRound.quick): with
 * ``start``, begin the round first (every slot free, no chunk completed, nothing sent, counts
 * zero, last_progress = now, next_scan = now + rto: what Round.start, NativeRound.restart and
 * RoundLoop's constructor do); then homagg_fp_run until min(next_scan, now + slice), as the general
 * loop's steps.  Sets ``rare`` when anything but packets, results and RTT samples
 * happened (Python then takes the general route for the counts and the window). */
int64_t homagg_fp_round(const hg_call *a, int64_t start) {
    hg_round *r = a->r;
    hg_recv_counts *k = a->counts;
    int ready = 3;
    double now = mono();
    if (start) {
        for (int64_t s = 0; s < a->job->nslot; s++)
            a->sl->cur[s] = -1;
        memset(a->completed, 0, (size_t)r->total);
        r->low = r->fr_next = r->nsent = r->done = 0;
        r->backlog = 1;
        r->last_progress = now;
        r->next_scan = now + r->rto;
        ready = 0;  /* nothing of this round can be there yet: poll first */
    }
    r->packets = r->retransmits = r->fast_retransmits = r->spurious = r->results = 0;
    r->send_stalls = r->refused = r->late = 0;
    k->ignored = k->probes = k->late = k->overflow = 0;
    double until = r->next_scan, soon = now + a->slice;
    int64_t rc = run((int)a->fd, (int)a->mfd, a->job, a->ch, r, a->sl, a->completed, a->b, k,
                     until < soon ? until : soon, ready);
    r->rare = r->win_changed || r->retransmits || r->fast_retransmits || r->spurious || r->send_stalls
              || r->refused || r->late || k->ignored || k->probes || k->overflow;
    return rc;
}
