/* The worker port's per-datagram work in C: build and send a batch of chunks (sendmmsg), receive
 * a batch of results (recvmmsg), check and match them, copy their words into the round's output.
 *
 * Plain C, no Python API, built into homagg.transport._fastpath_kernels and loaded with ctypes by
 * homagg/transport/_fastpath.py.  homagg/transport/_udp.py keeps the protocol (windows, timers,
 * fast retransmit) in Python and calls these two functions once per batch instead of running the
 * per-datagram steps in Python; its pure-Python loop (HOMAGG_NATIVE=0 or no compiler) does the
 * same steps one datagram at a time and stays the reference: tests/test_transport_fastpath.py
 * runs both and compares the bytes on the wire and the results.
 *
 * Wire format (homagg/wire.py, the one source of truth): a 20-byte big-endian header
 *   0 ver<<4|op  1 flags  2 job_id(16)  4 worker_id  5 reserved  6 word_count(16)
 *   8 bank<<15|slot(16)  10 tag(16)  12 offset(32)  16 token(32)
 * then word_count big-endian int32 words.
 *
 * Kernel batching (homagg/_udpseg.h): homagg_fp_send may hand the kernel runs of equal-length
 * datagrams as one GSO message (the caller decides: *gso), and homagg_fp_recv splits a coalesced
 * buffer (UDP_GRO, set by the caller) into its datagrams; either way the datagrams on the wire and
 * their handling are the ones of one message per datagram.
 *
 * Invariants: homagg_fp_send writes chunk c's datagram into its slot's buffer
 * (bufs + s * stride, s = (seq0 + c) % nslot) before sending it, so a retransmission resends those
 * bytes; homagg_fp_recv copies a result's words only when it matches the chunk outstanding in its
 * slot (cur[s]) in tag, bank, offset and word count, and marks that chunk completed exactly once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "_fastpath.h"
#include "_udpseg.h"
#include "_wirewords.h"

#define FLAG_RESULT 0x01
#define BATCH 64

static inline void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void put32(uint8_t *p, uint32_t v) { uint32_t b = __builtin_bswap32(v); memcpy(p, &b, 4); }
static inline uint32_t get16(const uint8_t *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static inline uint32_t get32(const uint8_t *p) { uint32_t b; memcpy(&b, p, 4); return __builtin_bswap32(b); }

/* Write chunk c's datagram into its slot's buffer; returns the buffer (its length: HDR + 4 wc). */
static uint8_t *build(const hg_job *job, const hg_chunks *ch, int64_t c, uint8_t *bufs, int64_t stride) {
    int64_t g = job->seq0 + c;
    int32_t s = (int32_t)(g % job->nslot), wc = ch->wc[c], off = ch->off[c];
    uint8_t *p = bufs + (int64_t)s * stride;
    p[0] = (uint8_t)((job->version << 4) | (ch->op[c] & 0xF));
    p[1] = 0;
    put16(p + 2, (uint32_t)job->job_id);
    p[4] = (uint8_t)job->rank;
    p[5] = 0;
    put16(p + 6, (uint32_t)wc);
    put16(p + 8, ((uint32_t)((g / job->nslot) & 1) << 15) | (uint32_t)(job->slot_base + s));
    put16(p + 10, (uint32_t)(g & 0xFFFF));
    put32(p + 12, (uint32_t)off);
    put32(p + 16, job->token);
    const int32_t j = ch->stream[c];
    if (ch->fill[j])
        ch->fill[j](ch->fill_ctx[j], p + HDR, off, wc);
    else
        hg_words_to_wire(p + HDR, ch->src[j] + off, wc);
    return p;
}

/* Build chunks ids[0..n) into their slot buffers and send them (sendmmsg on connected ``fd``).
 * With *gso set, consecutive chunks of the same length share one GSO message (homagg/_udpseg.h:
 * up to 64 datagrams and 64 KB); a message the kernel refuses as GSO (EIO, EINVAL) clears *gso
 * and its chunks go again one per message.  Returns how many chunks were sent, in ``ids`` order
 * (the rest: the socket buffer is full, EAGAIN), or -errno. */
int64_t homagg_fp_send(int fd, const hg_job *job, const hg_chunks *ch, const int64_t *ids, int64_t n,
                       uint8_t *bufs, int64_t stride, int32_t *gso) {
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH * HG_GSO_MAX_SEGMENTS];
    hg_segctl ctl[BATCH];
    int cnt[BATCH];
    int64_t done = 0, built = 0;  /* chunks sent; chunks built into slot buffers */
    while (done < n) {
        int k = 0, iv = 0;
        int64_t at = done;
        while (k < BATCH && at < n) {  /* one message: a run of equal-length chunks (GSO) or one */
            int most = *gso ? hg_gso_max_segments(HDR + 4 * (size_t)ch->wc[ids[at]]) : 1;
            int m = 0;
            while (m < most && at + m < n && ch->wc[ids[at + m]] == ch->wc[ids[at]]) {
                if (at + m >= built) {
                    build(job, ch, ids[at + m], bufs, stride);
                    built = at + m + 1;
                }
                int64_t c = ids[at + m], g = job->seq0 + c;
                iov[iv + m].iov_base = bufs + (g % job->nslot) * stride;
                iov[iv + m].iov_len = HDR + 4 * (size_t)ch->wc[c];
                m++;
            }
            memset(&msgs[k].msg_hdr, 0, sizeof msgs[k].msg_hdr);
            msgs[k].msg_hdr.msg_iov = &iov[iv];
            msgs[k].msg_hdr.msg_iovlen = (size_t)m;
            if (m > 1)
                hg_gso_set(&msgs[k].msg_hdr, &ctl[k], (uint16_t)iov[iv].iov_len);
            cnt[k++] = m;
            iv += m;
            at += m;
        }
        int sent = sendmmsg(fd, msgs, (unsigned)k, MSG_DONTWAIT);
        if (sent < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return done;
            if (msgs[0].msg_hdr.msg_controllen && (errno == EIO || errno == EINVAL) && *gso) {
                *gso = 0;  /* refused as GSO: these chunks and the rest, one datagram per message */
                continue;
            }
            return done ? done : -errno;
        }
        for (int i = 0; i < sent; i++)
            done += cnt[i];
        if (sent < k)
            return done;
    }
    return done;
}

/* Receive results on ``fd`` until it is drained or ``max_events`` chunks completed.  A result
 * matching the chunk outstanding in its slot: words copied into the output, completed[c] = 1,
 * cur[s] = -1, c appended to ``events``.  A valid result of this job that matches no outstanding
 * chunk: (s, tag, bank) appended to ``late`` (3 ints each; at most max_events).  Returns how many
 * events. */
int64_t homagg_fp_recv(int fd, const hg_job *job, const hg_chunks *ch, int64_t total, int64_t *cur,
                       uint8_t *completed, int64_t *events, int64_t max_events, int64_t *late,
                       int64_t *nlate, uint8_t *rbuf, int64_t stride, const uint8_t *probe, int64_t probe_len,
                       hg_recv_counts *counts) {
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    hg_segctl ctl[BATCH];
    int64_t nev = 0;
    counts->err = 0;
    counts->drained = 0;
    while (nev < max_events) {
        /* a buffer may hold up to HG_GSO_MAX_SEGMENTS results (UDP_GRO): ask for as many buffers
         * as their results surely fit in events[] (at least one) */
        int64_t room = (max_events - nev) / HG_GSO_MAX_SEGMENTS;
        int k = room < 1 ? 1 : (room < BATCH ? (int)room : BATCH);
        for (int i = 0; i < k; i++) {
            iov[i].iov_base = rbuf + (int64_t)i * stride;
            iov[i].iov_len = (size_t)stride;
            memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            hg_gro_prepare(&msgs[i].msg_hdr, &ctl[i]);
        }
        int got = recvmmsg(fd, msgs, (unsigned)k, MSG_DONTWAIT, NULL);
        if (got < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                counts->err = errno;
            else
                counts->drained = 1;
            break;
        }
        for (int i = 0; i < got; i++) {
            const int64_t blen = msgs[i].msg_len, gro = hg_gro_size(&msgs[i].msg_hdr);
            const int64_t seg = gro > 0 && gro < blen ? gro : blen;
            for (int64_t at = 0; at < blen || (blen == 0 && at == 0); at += seg > 0 ? seg : 1) {
                const uint8_t *p = rbuf + (int64_t)i * stride + at;
                int64_t len = blen - at < seg ? blen - at : seg;
                if (len < HDR) {
                    if (probe_len && len >= probe_len && memcmp(p, probe, (size_t)probe_len) == 0)
                        counts->probes++;
                    else
                        counts->ignored++;
                    continue;
                }
                uint32_t wc = get16(p + 6), bs = get16(p + 8), slot = bs & 0x7FFF, bank = bs >> 15;
                int64_t s = (int64_t)slot - job->slot_base;
                if (!((p[1] & FLAG_RESULT) && (int32_t)get16(p + 2) == job->job_id && s >= 0 && s < job->nslot
                      && len == HDR + 4 * (int64_t)wc && (p[0] >> 4) == job->version
                      && get32(p + 16) == job->token)) {
                    if (probe_len && len >= probe_len && memcmp(p, probe, (size_t)probe_len) == 0)
                        counts->probes++;
                    else
                        counts->ignored++;
                    continue;
                }
                uint32_t tag = get16(p + 10), off = get32(p + 12);
                int64_t c = cur[s], g = job->seq0 + c;
                if (c < 0 || c >= total || tag != (uint32_t)(g & 0xFFFF) || bank != (uint32_t)((g / job->nslot) & 1)
                    || (int32_t)off != ch->off[c] || (int32_t)wc != ch->wc[c]) {
                    if (*nlate < max_events) {
                        late[3 * *nlate] = s;
                        late[3 * *nlate + 1] = tag;
                        late[3 * *nlate + 2] = bank;
                        (*nlate)++;
                    }
                    counts->late++;
                    continue;
                }
                if (nev >= max_events) {  /* no room to report it: as if lost (the chunk is resent) */
                    counts->overflow++;
                    continue;
                }
                hg_words_from_wire(ch->out[ch->stream[c]] + off, p + HDR, wc);
                completed[c] = 1;
                cur[s] = -1;
                events[nev++] = c;
            }
        }
        if (got < k) {
            counts->drained = 1;
            break;
        }
    }
    return nev;
}
