/* The persistent kernel: resident blocks that take each batch from a pinned mailbox, with no launch per search.
 *
 * persist_kernel scans, merges and answers; persist_receive takes the tagged message. The host side: persist.cu. */
#ifndef TR_CUDA_PERSIST_KERNEL_CUH
#define TR_CUDA_PERSIST_KERNEL_CUH

#include "batch_scan.cuh"

/*
 * One cooperative launch keeps TR_CUDA_BLOCK-thread blocks resident on every SM. The host (the
 * server thread, after it has checked and normalised the requests as for a launch) writes a batch
 * of up to TR_BQ_MAX f16 queries and their parameters into a pinned, mapped mailbox as one tagged
 * message: 16-byte chunks of 12 bytes of the batch and the tag seq << 8 | nq, each written by one
 * atomic 16-byte store. Block 0 polls the message itself over PCIe (a batch is there when every chunk
 * it spans carries the tag) and relays the chunks as they came into device memory (dq); every other
 * block reads the relay in L2 the same way. (The build for tiers past the one-trip limit takes the
 * batch in mb->req and the query area, and then the word seq << 8 | nq, which block 0 polls before it
 * reads the batch and copies it into dreq/dq, raising ctl->go for the others: see the kernel.) Every block takes part in every batch (the
 * first G scan their share of rows, the others only take a ticket), so a batch cannot finish while
 * any block still reads the previous one. The last block to take its ticket merges (up to
 * TR_BQ_FUSE_MAX queries, or when there are fewer scanning blocks than queries), or releases blocks
 * 0..nq-1 to merge one query each; results go straight into the requests' slots (registered
 * segment) and, after a system-scope fence, the batch's seq into mb->done_seq, which the host polls.
 * nq = 0 stops the kernel: the host sends it before any write to the rows and when the server goes
 * to sleep, so an idle store does not keep the GPU spinning, and the next search launches it again.
 */
/* The builds with the one-trip merge, every block: polls the tagged message for batch seq at msg (block 0: the
 * host's, over PCIe; the others: block 0's relay in L2), each thread one chunk of its head; it is there when chunk
 * 0 carries this seq and every chunk it spans carries chunk 0's tag. Unpacks it into the block's sreq and staged
 * queries sq (block 0 also stores each chunk, as it came, at relay), reading a message longer than the head
 * (several queries, or large dims) on until all of it carries the tag, and zeroes the padding of the staged rows.
 * Returns the tag (seq << 8 | nq); tr_seen_ns: %globaltimer when the head was there, tr_seen_clk: clock64 then.
 * Not inlined: inlined, its registers made the scan of two builds spill. */
__shared__ unsigned long long tr_seen_ns;
__shared__ long long tr_seen_clk;
__device__ __noinline__ unsigned persist_receive(const uint4 *msg, uint4 *relay, PersistReq *sreq, uint4 *sq,
                                                 unsigned seq, unsigned nvec, unsigned qstride) {
    __shared__ unsigned s_tag;
    const unsigned tid = threadIdx.x;
    /* the head: what one query needs (a poll of more bytes took longer to come back) */
    const unsigned head = min(persist_msg_chunks(1, nvec), (unsigned)TR_MSG_HEAD);
    uint4 v = make_uint4(0, 0, 0, 0);
    unsigned tag, nchunks;
    if (!relay) { /* the relay in L2: one thread waits for chunk 0, then the block reads the rest (every thread
                   * polling its chunk reached the ticket sooner but slowed the merge: more traffic in L2) */
        if (tid == 0)
            while ((__ldcv(&msg[0].w) >> 8) != seq) __nanosleep(32);
        __syncthreads();
    }
    for (;;) {
        if (tid < head) v = __ldcv(msg + tid);
        if (tid == 0) s_tag = v.w;
        __syncthreads();
        tag = s_tag;
        nchunks = persist_msg_chunks(tag & 0xFFu, nvec);
        const bool ok = (tag >> 8) == seq && (tid >= min(nchunks, head) || v.w == tag);
        if (__syncthreads_and(ok)) break;
    }
    if (tid == 0) {
        tr_seen_clk = clock64();
        tr_seen_ns = global_ns();
    }
    const unsigned nq = tag & 0xFFu, req_words = (unsigned)(sizeof(PersistReq) / 4),
                   words = persist_msg_words(nq, nvec), row_words = nvec * 4u;
    auto unpack = [&](unsigned c, const uint4 &x) {
        if (relay) __stcg(relay + c, x); /* the chunk as it came, tag and all: one 16-byte store */
        const unsigned val[3] = {x.x, x.y, x.z};
#pragma unroll
        for (int i = 0; i < 3; i++) {
            const unsigned u = c * 3u + i;
            if (u < req_words) {
                reinterpret_cast<unsigned *>(sreq)[u] = val[i];
            } else if (u < words) {
                const unsigned j = u - req_words, r = j / row_words, col = j - r * row_words;
                reinterpret_cast<unsigned *>(sq)[r * qstride * 4u + col] = val[i];
            }
        }
    };
    if (tid < min(nchunks, head)) unpack(tid, v);
    for (bool rest = nchunks > head; rest;) { /* block-uniform */
        /* in rounds of TR_MSG_LOADS chunks per thread, all loads in flight before any is used */
        bool ok = true;
        for (unsigned c0 = head; c0 < nchunks; c0 += TR_MSG_LOADS * blockDim.x) {
            uint4 x[TR_MSG_LOADS];
#pragma unroll
            for (int i = 0; i < TR_MSG_LOADS; i++) {
                const unsigned c = c0 + i * blockDim.x + tid;
                x[i] = c < nchunks ? __ldcv(msg + c) : make_uint4(0, 0, 0, tag);
            }
#pragma unroll
            for (int i = 0; i < TR_MSG_LOADS; i++) {
                const unsigned c = c0 + i * blockDim.x + tid;
                if (x[i].w != tag) ok = false;
                else if (c < nchunks) unpack(c, x[i]);
            }
        }
        rest = !__syncthreads_and(ok);
    }
    /* padding inside a staged row feeds the mma: zeros (a row past nq feeds only its own, unread, column) */
    for (unsigned i = tid; i < nq * (qstride - nvec); i += blockDim.x) {
        const unsigned r = i / (qstride - nvec), c = nvec + (i - r * (qstride - nvec));
        sq[r * qstride + c] = make_uint4(0, 0, 0, 0);
    }
    return tag;
}

template <bool ONE_TRIP, bool SPLIT>
__global__ void __launch_bounds__(TR_CUDA_BLOCK, 2)
persist_kernel(PersistMailbox *mb, PersistReq *dreq, uint4 *dq, PersistCtl *ctl, unsigned seq, unsigned nvec,
               unsigned long long *phase) {
    extern __shared__ uint4 bsm[];
    __shared__ PersistReq sreq;
    __shared__ unsigned s_word;
    __shared__ bool is_last;
    __shared__ unsigned mcnt;
    __shared__ float mthr;
    __shared__ float wmax[TR_CUDA_WARPS];
    const unsigned tid = threadIdx.x, blk = blockIdx.x, nblocks = gridDim.x;
    const uint4 *mq = reinterpret_cast<const uint4 *>(mb + 1);
    const bool prof = phase != nullptr; /* --cuda-profile: per-block phases (TR_PH_*) */
    constexpr unsigned NREQ = sizeof(PersistReq) / sizeof(uint4);
    const unsigned qstride = (nvec + 3) / 4 * 4 + 1; /* BatchParams::qstride */
    uint4 *sq = bsm;                                  /* the scan's staged queries (batch_scan_block) */
    unsigned long long t_seen = 0;
    /* SPLIT: the row cache's layout, and the run it holds (the key: set by thread 0 between barriers, after every
     * thread has read it for the batch). In shared memory, not registers: kept in registers across the loop, they
     * made the scan spill. */
    __shared__ unsigned long long ckey_start, ckey_end;
    __shared__ const uint4 *ckey_x;
    __shared__ unsigned cache_off, cache_rows, cache_stride;
    if constexpr (SPLIT) {
        if (tid == 0) {
            cache_off = ctl->cache_off;
            cache_rows = ctl->cache_rows;
            cache_stride = ctl->cache_stride;
            ckey_x = nullptr;
        }
    }
    for (;;) {
        seq = persist_next_seq(seq);
        if constexpr (ONE_TRIP) { /* the tagged message (persist_receive) */
            /* Block 0 polls the host's message and relays its chunks, tags and all, into dq; every other block
             * reads them there as block 0 read the host's, each chunk checked by its own tag. Block 0 unpacking
             * into device memory and then raising go (a fence, then a flag the others polled before they loaded
             * the batch) was a fence and a round trip to L2 more. */
            if (blk == 0) persist_receive(persist_msg_area(mb, nvec), dq, &sreq, sq, seq, nvec, qstride);
            else persist_receive(dq, nullptr, &sreq, sq, seq, nvec, qstride);
            if (tid == 0) { /* no barrier first: thread 0 wrote tr_seen_* and unpacked chunk 0 (sreq.profile) itself */
                if (prof) {
                    tr_clk[0] = tr_seen_clk;
                    tr_clk[TR_PH_CYCLES + 1] = tr_seen_ns;
                }
                if (blk == 0 && sreq.profile) {
                    mb->stamp[0] = tr_seen_ns;
                    mb->stamp[1] = global_ns();
                    if (prof) ctl->go_ns = mb->stamp[1];
                }
            }
        } else {
            /* Tiers past the one-trip limit: the word, then the batch. The tagged message changed this build's
             * code enough to slow its scan, and one round trip is little at those sizes. */
            /* Each block loads the parameters into sreq and stages the queries into sq in one loop, so
             * their loads are in flight together: block 0 from the mailbox over PCIe (also copying them to
             * dreq/dq for the others), every other block from dreq/dq in L2 once go carries this seq. nq
             * rides in the low byte of the mailbox word and of go, so the loop's bounds are known first. */
            if (tid == 0) {
                if (blk == 0) {
                    unsigned w;
                    while (((w = ld_acquire_sys(&mb->word)) >> 8) != seq) {
                    }
                    s_word = w;
                    t_seen = global_ns();
                } else {
                    unsigned g;
                    while (((g = ld_acquire_gpu(&ctl->go)) >> 8) != seq) __nanosleep(32);
                    s_word = g;
                }
                if (prof) {
                    tr_clk[0] = clock64();
                    tr_clk[TR_PH_CYCLES + 1] = blk == 0 ? t_seen : global_ns();
                }
            }
            __syncthreads(); /* with tid 0's acquire: the loads below see what the word or go published */
            {
                /* Only the batch's own query rows: a row past nq feeds only its own column of the mma, whose scores
                 * nothing reads, so it needs no zeros. Zero-filling the whole tile (8 or 16 rows) would take each
                 * thread several trips round this loop at 768 dims, on the latency path of every batch. */
                const unsigned nq = s_word & 0xFFu;
                const uint4 *rsrc = blk == 0 ? reinterpret_cast<const uint4 *>(&mb->req) : reinterpret_cast<const uint4 *>(dreq);
                unsigned profile = 0;
                for (unsigned i = tid; i < NREQ + nq * qstride; i += blockDim.x) {
                    if (i < NREQ) {
                        const uint4 v = blk == 0 ? __ldcv(rsrc + i) : __ldcg(rsrc + i);
                        reinterpret_cast<uint4 *>(&sreq)[i] = v;
                        if (blk == 0) reinterpret_cast<uint4 *>(dreq)[i] = v;
                        if (i == 0) profile = v.z; /* PersistReq::profile */
                    } else {
                        const unsigned j = i - NREQ, r = j / qstride, c = j - r * qstride;
                        uint4 v = make_uint4(0, 0, 0, 0);
                        if (r < nq && c < nvec) {
                            v = blk == 0 ? __ldcv(mq + r * nvec + c) : __ldcg(dq + r * nvec + c);
                            if (blk == 0) dq[r * nvec + c] = v;
                        }
                        sq[j] = v;
                    }
                }
                if (blk == 0) {
                    /* Fences in this kernel follow cooperative groups' grid sync: the block's threads meet
                     * at a barrier and one thread fences (here: the release of go) for all of them. A fence
                     * in every thread first, then the release's own, was two fence latencies in a row. */
                    __syncthreads();
                    if (tid == 0) {
                        if (profile) {
                            mb->stamp[0] = t_seen;
                            mb->stamp[1] = global_ns();
                            if (prof) ctl->go_ns = mb->stamp[1];
                        }
                        st_release_gpu(&ctl->go, s_word);
                    }
                }
            }
        }
        __syncthreads();
        if (prof && tid == 0) tr_clk[1] = tr_clk[2] = tr_clk[3] = clock64();
        const unsigned nq = sreq.nq, G = sreq.G;
        if (nq == 0) return; /* stop */
        const BatchParams &p = sreq.p;
        /* SPLIT: this block's run of rows, which the split scan reads from the row cache: copied in first
         * (row_cache_fill) unless the cache holds it from an earlier batch. The host starts this build only for
         * runs the cache holds (row_cache_layout), and a running kernel's runs only shrink. Computed again after
         * the scan: kept across it, they made the scan spill. */
        auto run_start = [&]() { return (unsigned long long)blk * p.rows_per_block; };
        auto run_end = [&]() {
            const unsigned long long e = run_start() + p.rows_per_block;
            return e < p.rows ? e : p.rows;
        };
        auto cached = [&]() { return SPLIT && nq <= 8 && blk < G && p.rows_per_block <= cache_rows; };
        if (blk < G) {
            if (nq <= 8) {
                if (cached()) {
                    RowCache rc{};
                    if constexpr (SPLIT) {
                        const unsigned long long c_start = run_start(), c_end = run_end();
                        rc.rows = cache_off;
                        rc.stride = cache_stride;
                        rc.ids = cache_off + cache_rows * cache_stride;
                        rc.ns = rc.ids + (cache_rows + 1u) / 2u;
                        if (!(ckey_x == p.X && ckey_start == c_start && ckey_end == c_end)) { /* block-uniform */
                            row_cache_fill(p, rc, bsm, c_start, c_end);
                            __syncthreads();
                        }
                    }
                    batch_scan_block<1, SPLIT>(p, nullptr, true, blk, G, bsm, prof, rc);
                } else { /* the builds without the split scan; the split one never asks for it (see above) */
                    batch_scan_block<1>(p, nullptr, true, blk, G, bsm, prof);
                }
            } else {
                batch_scan_block<2>(p, nullptr, true, blk, G, bsm, prof);
            }
        }
        __syncthreads();
        if constexpr (SPLIT) {
            if (tid == 0) {
                if (cached()) { /* filled before the scan just finished, or held already */
                    ckey_x = p.X;
                    ckey_start = run_start();
                    ckey_end = run_end();
                } else if (blk < G) {
                    ckey_x = nullptr; /* the other scans' buffers overlap the cache */
                }
            }
        }
        if (tid == 0) {
            prof_clock(prof, TR_PH_LISTS + 1);
            __threadfence(); /* this block's lists are visible device-wide before its ticket */
            prof_clock(prof, TR_PH_FENCE + 1);
            is_last = atomicInc(&ctl->ticket, nblocks - 1) == nblocks - 1;
            if (prof) {
                tr_clk[TR_PH_TICKET + 1] = clock64();
                unsigned long long *ph = phase + (size_t)blk * TR_PH_SLOTS;
                for (int i = 0; i <= TR_PH_TICKET; i++) ph[i] += (unsigned long long)(tr_clk[i + 1] - tr_clk[i]);
                ph[TR_PH_CYCLES] += (unsigned long long)(tr_clk[TR_PH_TICKET + 1] - tr_clk[0]);
                const unsigned long long seen = (unsigned long long)tr_clk[TR_PH_CYCLES + 1];
                ph[TR_PH_NS] += global_ns() - seen;
                if (blk) ph[TR_PH_GO_NS] += seen - ctl->go_ns;
                ph[TR_PH_COUNT] += 1;
            }
            if (is_last) __threadfence(); /* acquire: every block's lists, for the barrier's readers */
        }
        __syncthreads();
        const bool parallel = nq > TR_BQ_FUSE_MAX && nq <= G;
        long long *mid = reinterpret_cast<long long *>(bsm); /* the merge aliases the scan's buffers */
        float *ms = reinterpret_cast<float *>(mid + TR_BQ_MCB);
        if (is_last) {
            if (tid == 0 && sreq.profile) mb->stamp[2] = global_ns();
            if (!parallel) {
                for (unsigned qi = 0; qi < nq; qi++)
                    merge_query<ONE_TRIP>(p, G, qi, ms, mid, mcnt, mthr, wmax,
                                sreq.profile && qi == 0 ? mb->merge_stamp : nullptr);
                __syncthreads(); /* then done_seq's release (fence.sys) orders every thread's results */
                if (tid == 0) {
                    if (sreq.profile) mb->stamp[3] = global_ns();
                    st_release_sys(&mb->done_seq, seq);
                }
            } else if (tid == 0) {
                st_release_gpu(&ctl->merge_go, seq);
            }
        }
        if (parallel && blk < nq) {
            if (tid == 0)
                while (ld_acquire_gpu(&ctl->merge_go) != seq) __nanosleep(32);
            __syncthreads();
            merge_query<ONE_TRIP>(p, G, blk, ms, mid, mcnt, mthr, wmax);
            __syncthreads();
            if (tid == 0) {
                __threadfence_system(); /* this query's results, before its merge ticket */
                if (atomicInc(&ctl->merge_ticket, nq - 1) == nq - 1) {
                    __threadfence_system();
                    if (sreq.profile) mb->stamp[3] = global_ns();
                    st_release_sys(&mb->done_seq, seq);
                }
            }
        }
        __syncthreads(); /* sreq and the shared buffers are reused by the next batch */
    }
}
#endif
