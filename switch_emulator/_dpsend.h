/* The native engine's output queue (switch_emulator/_dataplane.c): the datagrams one batch of
 * the pipeline made (results to workers and groups, a child's up packets to its parent), sent with
 * one sendmmsg, grouped into UDP GSO messages where the kernel takes them (homagg/_udpseg.h).
 *
 * Invariants: datagrams leave in the order the pipeline queued them per destination (a GSO
 * message holds datagrams of one destination and one length, in queue order, and a datagram of
 * another length to that destination opens the next message); the grouping looks only at the
 * destination and the length, never at the header, so a result, an answer and an up packet are
 * batched alike.  A GSO message the kernel refuses switches GSO off for good (one datagram per
 * message from then on).  Included once, by _dataplane.c.
 */
#ifndef HOMAGG_DPSEND_H
#define HOMAGG_DPSEND_H

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "_udpseg.h"

#define HG_HDR 20
#define BATCH 64
#define MAX_WORKERS 32
#define MAX_COPIES (BATCH * (MAX_WORKERS + 1))
#define STRIDE (65536 + 64)

typedef struct {
    struct mmsghdr msgs[MAX_COPIES];   /* one datagram each, in the order the pipeline made them */
    struct iovec iov[MAX_COPIES][2];
    struct sockaddr_in dst[MAX_COPIES];
    uint8_t hdr[MAX_COPIES][HG_HDR];
    int n;
    uint8_t *payloads;    /* BATCH payload buffers of STRIDE bytes (results of this batch) */
    int npay;
    /* the same datagrams as GSO messages (gso_group): same destination, same length, in order */
    struct mmsghdr gmsgs[MAX_COPIES];
    struct iovec giov[2 * MAX_COPIES];
    hg_segctl gctl[MAX_COPIES];
    int order[MAX_COPIES];             /* datagram indices in GSO message order */
    int gfirst[MAX_COPIES];            /* GSO message m holds order[gfirst[m] ..] */
    uint8_t taken[MAX_COPIES];
} outq;

/* Whether results go out as GSO messages (homagg/_udpseg.h); cleared for good when the kernel
 * refuses one (no checksum offload on the route's device, an MTU below the datagram, ...). */
static int gso_on = 1;

int32_t hg_set_gso(int32_t on) {
    int32_t was = gso_on;
    gso_on = on != 0;
    return was;
}

/* sendmmsg m[0..n): a full socket buffer is waited for (50 ms at most, then the rest counts as
 * lost: workers retransmit), a message the kernel refuses is skipped (e.g. a worker went away).
 * With ``gso_fail``: a GSO message refused with EIO or EINVAL stops the sending there and its
 * index goes to *gso_fail (the caller resends from it one datagram per message). */
static void send_all(int fd, struct mmsghdr *m, int n, int *gso_fail) {
    int done = 0;
    while (done < n) {
        int sent = sendmmsg(fd, m + done, (unsigned)(n - done), MSG_DONTWAIT);
        if (sent > 0) {
            done += sent;
            continue;
        }
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {fd, POLLOUT, 0};
            if (poll(&p, 1, 50) > 0)
                continue;
            break;        /* buffer still full after 50 ms: the rest counts as lost */
        }
        if (gso_fail != NULL && m[done].msg_hdr.msg_controllen && (errno == EIO || errno == EINVAL)) {
            *gso_fail = done;
            return;
        }
        done++;           /* e.g. a worker went away: skip that copy (workers retransmit) */
    }
}

/* Group the queued datagrams into GSO messages: each takes the first datagram not yet taken and
 * the following ones to the same destination with the same length (up to the GSO limits);
 * per destination the order stays the pipeline's.  Returns how many messages. */
static int gso_group(outq *q) {
    memset(q->taken, 0, (size_t)q->n);
    int ng = 0, no = 0, iv = 0;
    for (int a = 0; a < q->n; a++) {
        if (q->taken[a])
            continue;
        const size_t plen = q->iov[a][1].iov_len;
        const int most = hg_gso_max_segments(HG_HDR + plen);
        const int iv0 = iv;
        int cnt = 0;
        q->gfirst[ng] = no;
        for (int b = a; b < q->n && cnt < most; b++) {
            if (q->taken[b] || q->dst[b].sin_addr.s_addr != q->dst[a].sin_addr.s_addr
                || q->dst[b].sin_port != q->dst[a].sin_port)
                continue;
            if (q->iov[b][1].iov_len != plen)
                break;    /* a datagram of another length: it opens the next message */
            q->taken[b] = 1;
            q->order[no++] = b;
            q->giov[iv++] = q->iov[b][0];
            q->giov[iv++] = q->iov[b][1];
            cnt++;
        }
        struct msghdr *h = &q->gmsgs[ng].msg_hdr;
        memset(h, 0, sizeof *h);
        h->msg_name = &q->dst[a];
        h->msg_namelen = sizeof q->dst[a];
        h->msg_iov = &q->giov[iv0];
        h->msg_iovlen = (size_t)(iv - iv0);
        if (cnt > 1)
            hg_gso_set(h, &q->gctl[ng], (uint16_t)(HG_HDR + plen));
        ng++;
    }
    return ng;
}

static void flush(int fd, outq *q) {
    int ng = gso_on && q->n > 1 ? gso_group(q) : q->n;
    if (ng < q->n) {
        int fail = -1;
        send_all(fd, q->gmsgs, ng, &fail);
        if (fail >= 0) {  /* refused: from that message on, one datagram per message, for good */
            gso_on = 0;
            int first = q->gfirst[fail], rest = q->n - first;
            for (int t = 0; t < rest; t++)
                q->gmsgs[t] = q->msgs[q->order[first + t]];
            send_all(fd, q->gmsgs, rest, NULL);
        }
    } else {
        send_all(fd, q->msgs, q->n, NULL);
    }
    q->n = 0;
    q->npay = 0;
}

#endif
