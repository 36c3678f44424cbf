/* flashattn: exact attention, IO-aware. Stable C ABI.
 *
 * Every function returns an fa_status; on failure fa_last_error() gives a
 * message (thread-local) that names the problem. Nothing here aborts.
 *
 * Layout is flash-attn's: q (batch, seqlen_q, heads_q, head_dim),
 * k/v (batch, seqlen_k, heads_kv, head_dim). For variable-length batches the
 * batch dimension is dropped, q is (total_q, heads_q, head_dim) and
 * fa_varlen gives the cumulative sequence lengths. Strides are in elements;
 * only the last dimension must be contiguous. A tensor with a zero dimension
 * is never touched: any strides and pointer are accepted (zero batch, empty
 * sequences).
 *
 * Memory: outputs (out, lse; dq, dk, dv; the backward workspace) must not
 * share a byte with an input or with each other (FA_ERROR_INVALID_ARGUMENT
 * names the pair); inputs may overlap each other (packed qkv views). Every
 * extent is checked in bytes, in 64-bit arithmetic, before memory is touched.
 *
 * The logsumexp is f32, natural log, (batch, heads_q, seqlen_q), or
 * (heads_q, total_q) for variable-length batches. A query row that sees no key
 * gets output 0 and lse = -inf.
 *
 * NaN and Inf (docs/semantics.md): a key is visible to a query row when the
 * mask (causal, window; a block mask's lists, fa_block_mask) lets the row see
 * it; the row's results are computed from its visible keys only, in IEEE
 * arithmetic.
 *   - A NaN in a visible input reaches exactly the results that depend on it:
 *     q row i or a key k_j visible to i -> out row i, lse_i and (backward) the
 *     gradients that row feeds; v_j[c] -> out[i][c] of every row i seeing j
 *     (even where its weight rounds to 0: 0 x NaN = NaN), and the gradients
 *     through those outputs. Inf follows IEEE (+inf scores give NaN rows).
 *   - Masked keys never contribute, whatever they hold (NaN, Inf): results
 *     equal those of any finite values there.
 *   - A row that sees no key (or whose every visible score is -inf) gets out
 *     0, lse -inf and zero gradients.
 *
 * Limits (FA_ERROR_INVALID_ARGUMENT beyond them) keep every backend's 32-bit
 * index arithmetic provably in range: seqlen_q, seqlen_k (max_seqlen_q/k for
 * variable-length batches) <= FA_MAX_SEQLEN; batch x heads x
 * ceil(seqlen / FA_MIN_TILE_ROWS) <= INT32_MAX for q (heads_q) and for k
 * (heads_kv); heads and batch fit int32. Window sizes at least as wide as the
 * range they could cut (left >= seqlen_k, right >= seqlen_q) mean unbounded and
 * are treated as -1.
 */
#ifndef FLASHATTN_FLASHATTN_H
#define FLASHATTN_FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define FA_API __declspec(dllexport)
#else
#define FA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header (fa_version() gives the library's), and the most
 * dimensions an fa_tensor has. */
#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0
#define FA_MAX_DIMS 4
#define FA_MAX_SEQLEN (1 << 29)
#define FA_MIN_TILE_ROWS 16      /* the smallest row tile of any kernel */
#define FA_WORKSPACE_ALIGNMENT 16 /* bytes; fa_backward rejects a misaligned workspace */

/* What every function returns; fa_status_string() names it. */
typedef enum fa_status {
  FA_OK = 0,
  FA_ERROR_INVALID_ARGUMENT = 1,  /* bad shape, stride, option or pointer */
  FA_ERROR_UNSUPPORTED = 2,       /* valid, but not implemented (dtype, head dim, ...) */
  FA_ERROR_BACKEND_UNAVAILABLE = 3, /* backend not built, or no device present */
  FA_ERROR_DEVICE = 4,            /* a CUDA call failed */
  FA_ERROR_OUT_OF_MEMORY = 5,
  FA_ERROR_INTERNAL = 6
} fa_status;

/* Element types: float32, float16, bfloat16; int32 for index tensors only
 * (fa_block_mask), never for q, k, v or their results. */
typedef enum fa_dtype { FA_F32 = 0, FA_F16 = 1, FA_BF16 = 2, FA_I32 = 3 } fa_dtype;

/* Where a tensor's memory lives. */
typedef enum fa_device_type { FA_DEVICE_CPU = 0, FA_DEVICE_CUDA = 1 } fa_device_type;

/* Which implementation runs a call. */
typedef enum fa_backend {
  FA_BACKEND_AUTO = 0, /* where the tensors live: CUDA tensors -> CUDA, host -> CPU */
  FA_BACKEND_CPU = 1,
  FA_BACKEND_CUDA = 2
} fa_backend;

/* A strided view of memory the caller owns (shape and strides up to ndim). */
typedef struct fa_tensor {
  void* data;
  fa_dtype dtype;
  fa_device_type device;
  int32_t device_index;
  int32_t ndim;
  int64_t shape[FA_MAX_DIMS];
  int64_t strides[FA_MAX_DIMS]; /* elements */
} fa_tensor;

/* Variable-length batches. cu_seqlens_* are int32, batch+1 entries,
 * non-decreasing, starting at 0 and ending at total tokens; they live on the
 * same device as q. max_seqlen_* bound every sequence. They are checked on the
 * host (on CUDA a copy back, which waits for the call's stream) unless the
 * stream is being captured into a CUDA graph: the call then clamps them on the
 * device at replay (each sequence's rows inside the tensors, at most
 * max_seqlen), so bad values give wrong rows, never an access outside the
 * tensors. */
typedef struct fa_varlen {
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int32_t batch;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
} fa_varlen;

/* Options of a call: start from fa_default_options(), then set fields. */
typedef struct fa_options {
  float softmax_scale;   /* 0 -> 1/sqrt(head_dim) */
  int32_t causal;        /* bottom-right aligned when seqlen_q != seqlen_k */
  int32_t window_left;   /* -1 = unbounded */
  int32_t window_right;  /* -1 = unbounded */
  float softcap;         /* 0 = off; else scores -> softcap*tanh(scores/softcap) */
  int32_t deterministic; /* backward: bitwise reproducible gradients */
  fa_backend backend;
  void* stream;          /* cudaStream_t for the CUDA backend; NULL = default stream */
  int32_t num_threads;   /* CPU backend; 0 = all hardware threads */
  int32_t reserved[7];   /* must be zero (checked); room to grow without breaking the ABI */
} fa_options;

/* A block-sparse mask in FlexAttention's BlockMask layout (docs/variants.md).
 * Query row i (counted within its sequence) lies in query block i / block_q,
 * key j in key block j / block_k; q_blocks = ceil(seqlen_q / block_q) and
 * k_blocks = ceil(seqlen_k / block_k) (max_seqlen_q/k for variable-length
 * batches). Per (sequence b, query head h, query block qb), int32 host tensors:
 *   kv_num_blocks[b][h][qb]       (B, H, q_blocks): how many entries of
 *   kv_indices[b][h][qb][0 ..]    (B, H, q_blocks, max_blocks) are key blocks
 *                                  the query block visits (the "partial" ones);
 *   full_kv_num_blocks, full_kv_indices: likewise the "full" ones, or both NULL.
 * B is 1 or batch and H is 1 or heads_q (1 = the same lists for every
 * sequence / head). Entries past a count are never read; every read index must
 * lie in [0, k_blocks) and a key block may appear once in the two lists of a
 * query block together. Row i sees key j when the element mask (causal,
 * window, sequence lengths) lets it AND block (i / block_q, j / block_k) is
 * listed, partial or full: flashattn has no mask_mod, so both kinds take the
 * element mask; blocks in neither list are skipped. The CUDA backend restates
 * the lists on its kernels' tiles and copies them to the device, keeping the
 * last few masks' copies; under stream capture it takes a copy kept from an
 * earlier call with the same lists (the graph's warm-up) and keeps it for the
 * process's life, else FA_ERROR_UNSUPPORTED. */
typedef struct fa_block_mask {
  int32_t block_q;  /* query rows per block (FlexAttention's BLOCK_SIZE[0]), > 0 */
  int32_t block_k;  /* keys per block (BLOCK_SIZE[1]), > 0 */
  const fa_tensor* kv_num_blocks;
  const fa_tensor* kv_indices;
  const fa_tensor* full_kv_num_blocks; /* NULL: no full blocks */
  const fa_tensor* full_kv_indices;    /* NULL exactly when full_kv_num_blocks is */
  int32_t reserved[4];                 /* zero */
} fa_block_mask;

/* Score extras beyond fa_options, for fa_forward_ex / fa_backward_ex (the
 * plain entry points are these with every extra off). Each tensor is f32 on
 * q's device, or NULL for off. Host values of alibi_slopes and sinks are checked
 * (finite; sinks may be -inf); device values are not read on the host (that
 * would synchronize the stream): a NaN or Inf there reaches the rows that use it.
 *   alibi_slopes: (heads_q) or (batch, heads_q); score -= slope * |i + seqlen_k - seqlen_q - j|
 *                 (per sequence for varlen), added after softcap (flash-attn 2.x).
 *   sinks:        (heads_q); a logit per query head that joins each row's softmax
 *                 denominator and carries no value (gpt-oss): the lse includes it,
 *                 and a row that sees no key gets out 0 and lse = sink.
 *   dsinks:       fa_backward_ex only, required when sinks is given, (heads_q):
 *                 overwritten with the gradient of the loss w.r.t. sinks.
 *   dropout_p:    in [0, 1); each attention probability is dropped with this
 *                 probability and the kept ones scaled by 1 / (1 - p) (the lse is
 *                 the one before dropout). The keep bits are Philox4x32-7 of the
 *                 element's coordinates under (dropout_seed, dropout_offset): give
 *                 the backward the forward's values. fa_dropout_mask shows them.
 *   block_mask:   NULL, or the key blocks each query block visits (fa_block_mask);
 *                 give the backward the forward's mask; dropout applies too
 *                 (docs/variants.md). */
typedef struct fa_extras {
  const fa_tensor* alibi_slopes;
  const fa_tensor* sinks;
  fa_tensor* dsinks;
  float dropout_p;
  uint64_t dropout_seed;
  uint64_t dropout_offset;
  const fa_block_mask* block_mask; /* where reserved[0..1] were: size and other offsets unchanged */
  int32_t reserved[6];             /* zero; room to grow without breaking the ABI */
} fa_extras;

/* Defaults: scale 1/sqrt(d), no mask, window (-1,-1), auto backend. */
FA_API fa_options fa_default_options(void);

/* Every extra off. */
FA_API fa_extras fa_default_extras(void);

/* The calling thread's last error message; the names of a status and of a
 * dtype; the library's version ("0.1.0"). */
FA_API const char* fa_last_error(void);
FA_API const char* fa_status_string(fa_status status);
FA_API const char* fa_dtype_name(fa_dtype dtype);
FA_API const char* fa_version(void);
/* The git commit the library was built from ("+dirty" if the tree had
   uncommitted changes, "unknown" outside git) and the CUDA architectures
   compiled in ("" without CUDA), e.g. "1a2b3c4d5e6f" and "80,90a". */
FA_API const char* fa_build_commit(void);
FA_API const char* fa_build_cuda_architectures(void);

/* 1 if the backend was compiled in and can run here (CUDA: a device is visible). */
FA_API int fa_backend_available(fa_backend backend);
/* Why a backend cannot run here, or "" if it can. */
FA_API const char* fa_backend_unavailable_reason(fa_backend backend);

/* out = softmax(scale * q k^T + mask) v ; lse may be NULL; varlen may be NULL. */
FA_API fa_status fa_forward(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                            fa_tensor* out, fa_tensor* lse, const fa_varlen* varlen,
                            const fa_options* options);

/* Bytes of scratch memory fa_forward uses beyond its inputs and outputs:
 * never O(seqlen^2). CPU: the per-thread tiles it allocates. CUDA: what the
 * Hopper forward allocates from the stream-ordered pool for these arguments
 * when it splits the last round of an unmasked run of at least 8192 keys
 * (partial outputs: 512 x (head_dim + 8) bytes per piece of a cut query tile,
 * at most a few pieces per SM); 0 for every other call. */
FA_API fa_status fa_forward_workspace_size(const fa_tensor* q, const fa_tensor* k,
                                           const fa_tensor* v, const fa_varlen* varlen,
                                           const fa_options* options, size_t* bytes);

/* Bytes of scratch memory fa_backward needs for these arguments, on the
 * tensors' device. */
FA_API fa_status fa_backward_workspace_size(const fa_tensor* q, const fa_tensor* k,
                                            const fa_tensor* v, const fa_varlen* varlen,
                                            const fa_options* options, size_t* bytes);

/* Gradients by recomputation from lse (the forward's logsumexp). workspace may
 * be NULL, in which case the library allocates (and frees) what it needs; pass
 * a buffer of fa_backward_workspace_size() bytes, FA_WORKSPACE_ALIGNMENT-byte
 * aligned and on the tensors' device, to keep allocations off the hot path. */
FA_API fa_status fa_backward(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                             const fa_tensor* out, const fa_tensor* dout, const fa_tensor* lse,
                             fa_tensor* dq, fa_tensor* dk, fa_tensor* dv,
                             const fa_varlen* varlen, const fa_options* options,
                             void* workspace, size_t workspace_bytes);

/* ---- Inference: attention against a KV cache (flash-attn 2.x flash_attn_with_kvcache) ----
 *
 * The cache is either contiguous, k_cache/v_cache (batch_cache, seqlen_cache, heads_kv, d),
 * sequence b living in cache row cache_batch_idx[b] (b when NULL), or paged,
 * k_cache/v_cache (num_blocks, block_size, heads_kv, d) with block_table
 * (batch, max_blocks) int32: key j of sequence b lives in page block_table[b][j / block_size]
 * at slot j % block_size. Sequence b holds cache_seqlens[b] tokens (cache_seqlen for every
 * sequence when cache_seqlens is NULL).
 *
 * When k_new/v_new (batch, seqlen_new, heads_kv, d) are given they are written into the cache
 * in place at positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 (also across
 * pages), and attention sees seqlen_k = cache_seqlens[b] + seqlen_new keys. With rotary_cos /
 * rotary_sin (seqlen_ro, rotary_dim / 2) the first rotary_dim columns of the new keys are
 * rotated at their positions, and q row i at position cache_seqlens[b] + i when the call is
 * causal or windowed, at cache_seqlens[b] otherwise (flash-attn's rule); rotary_interleaved
 * pairs columns (0,1), (2,3), ... instead of (i, i + rotary_dim/2). Rotary needs k_new.
 *
 * q and out are (batch, seqlen_q, heads_q, d), lse (batch, heads_q, seqlen_q) f32 or NULL.
 * Options as for fa_forward (causal is bottom-right aligned: the last query row sees the
 * whole cache). Index arrays (block_table, cache_seqlens, cache_batch_idx) live on q's device.
 * They are checked on the host (a copy back from the device, a synchronization) unless the
 * stream is being captured into a CUDA graph or trust_indices is 1; the kernels then check
 * them again and give a sequence with an index out of range NaN output and lse, writing
 * nothing of it into the cache: a bad index never reads or writes outside the cache. */
typedef struct fa_kvcache {
  fa_tensor* k_cache;
  fa_tensor* v_cache;
  const int32_t* block_table;       /* NULL: contiguous cache */
  int64_t block_table_stride;       /* elements between rows of block_table */
  int32_t max_blocks;               /* columns of block_table */
  const int32_t* cache_seqlens;     /* int32[batch], or NULL */
  int32_t cache_seqlen;             /* every sequence's length when cache_seqlens is NULL */
  const int32_t* cache_batch_idx;   /* int32[batch] or NULL (contiguous caches only) */
  const fa_tensor* k_new;           /* NULL: nothing appended */
  const fa_tensor* v_new;
  const fa_tensor* rotary_cos;      /* NULL: no rotary */
  const fa_tensor* rotary_sin;
  int32_t rotary_interleaved;
  int32_t num_splits;               /* CUDA split-KV pieces per sequence; 0 = heuristic */
  int32_t trust_indices;            /* 1: skip the host check of the index arrays */
  int32_t reserved[7];              /* zero */
} fa_kvcache;

/* An fa_kvcache with every optional field absent (NULL / 0). */
FA_API fa_kvcache fa_default_kvcache(void);

/* out = attention(q, cache (+ new tokens)); appends k_new/v_new into the cache first.
 * workspace may be NULL (the CUDA backend then takes what it needs from the stream-ordered
 * pool; the CPU backend allocates on the host); pass fa_forward_kvcache_workspace_size()
 * bytes on q's device to keep allocations out of the call (CUDA graphs). */
FA_API fa_status fa_forward_kvcache(const fa_tensor* q, const fa_kvcache* cache, fa_tensor* out,
                                    fa_tensor* lse, const fa_options* options, void* workspace,
                                    size_t workspace_bytes);

/* fa_forward_kvcache with score extras (see fa_extras); extras may be NULL (= all off).
 * alibi_slopes and sinks apply as in fa_forward_ex, with the bias and the causal diagonal
 * of each sequence's keys (cache_seqlens[b] + seqlen_new). dropout_p, dsinks and block_mask
 * are not taken here (a clear error). Both backends run ALiBi and sinks (on CUDA: the bias in
 * the decode kernel's scores, the sink in its final merge or the split combine's). */
FA_API fa_status fa_forward_kvcache_ex(const fa_tensor* q, const fa_kvcache* cache, fa_tensor* out,
                                       fa_tensor* lse, const fa_options* options,
                                       const fa_extras* extras, void* workspace,
                                       size_t workspace_bytes);

/* Bytes of workspace fa_forward_kvcache needs for these arguments, on q's device (CUDA:
 * the rotated q and the split-KV partial states) or on the host (CPU backend). */
FA_API fa_status fa_forward_kvcache_workspace_size(const fa_tensor* q, const fa_kvcache* cache,
                                                   const fa_options* options, size_t* bytes);
/* fa_forward / fa_backward with score extras; extras may be NULL (= all off). */
FA_API fa_status fa_forward_ex(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                               fa_tensor* out, fa_tensor* lse, const fa_varlen* varlen,
                               const fa_options* options, const fa_extras* extras);
FA_API fa_status fa_backward_ex(const fa_tensor* q, const fa_tensor* k, const fa_tensor* v,
                                const fa_tensor* out, const fa_tensor* dout, const fa_tensor* lse,
                                fa_tensor* dq, fa_tensor* dk, fa_tensor* dv,
                                const fa_varlen* varlen, const fa_options* options,
                                const fa_extras* extras, void* workspace, size_t workspace_bytes);

/* The dropout factors the kernels use for these extras (dropout_p, seed,
 * offset): mask is f32 (batch, heads_q, seqlen_q, seqlen_k) on the host, and
 * element (b, h, i, j) gets 1 / (1 - dropout_p) where the probability of query
 * row i for key j of sequence b is kept, 0 where it is dropped (for variable
 * length batches, i and j count within sequence b). For tests and debugging. */
FA_API fa_status fa_dropout_mask(const fa_extras* extras, fa_tensor* mask);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHATTN_FLASHATTN_H */
