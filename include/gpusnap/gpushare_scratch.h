/* Scratch device memory under the gpushare shim (docs/GPUSHARE.md, "Scratch
 * memory").
 *
 * A workload running with the shim preloaded may say of a range of its device
 * memory that its contents need no saving: a KV-cache pool, whose every
 * request overwrites what it uses. At a checkpoint (and a suspend in place)
 * the shim then releases that memory without copying it to the host or
 * storing it in the chunk store; at a restore (and a resume) the memory is
 * there again at the same address, reading zero. Everything else about it is
 * unchanged: the application reads and writes it as before, before and after.
 *
 * The functions are exported by the shim itself, with C linkage; a program
 * does not link against anything to call them but finds them at run time,
 * where they are absent when the shim is not preloaded:
 *
 *   C:       dlsym(RTLD_DEFAULT, GPUSNAP_GPUSHARE_MARK_SCRATCH)
 *   Python:  ctypes.CDLL(None).gpusnap_gpushare_mark_scratch
 *            (argtypes [c_uint64, c_size_t], restype c_int; AttributeError
 *            when the shim is not there)
 *
 * What is marked. The shim saves memory in 64 MiB chunks counted from the
 * start of each allocation it made (every cuMemAlloc of 2 MiB or more:
 * cudaMalloc, PyTorch's caching allocator). A chunk lying wholly inside
 * marked ranges is scratch; a chunk only partly inside is saved as usual,
 * so a mark never drops a byte outside it. A range reaching the end of what
 * cuMemAlloc was asked for covers the allocation's rounding up to its
 * granularity as well (bytes nobody was given). Marks of one allocation add
 * up (two adjacent marks cover the chunk they share); they end with the
 * allocation (cuMemFree) and with an unmark. A mark is in force for every
 * release after it; one made while a checkpoint is under way may or may not
 * count for that checkpoint.
 *
 * After a release and load, scratch chunks read zero. That holds wherever
 * the memory comes back from the chunk store: a restore, a resume in place,
 * and a checkpoint's source brought back by --leave-running or after a
 * failure. A checkpoint comes between two GPU calls of the process, so work
 * spanning it (a request's kernels) finds zeros from the next call on.
 *
 * Return values: 0 on success, else a positive errno value and nothing
 * changed:
 *   EINVAL  bytes is 0, or ptr + bytes overflows;
 *   ENOENT  some byte of the range is not in memory the shim allocated: an
 *           allocation under 2 MiB (it stays with the driver and its
 *           checkpoint), the application's own VMM memory (cuMemCreate,
 *           PyTorch's expandable segments), stream-ordered memory
 *           (cuMemAllocAsync), host memory, or memory already freed.
 *
 * Thread-safety: callable from any thread at any time, also while the
 * process is quiesced or released; they take the shim's allocation lock and
 * make no driver call.
 */
#ifndef GPUSNAP_GPUSHARE_SCRATCH_H_
#define GPUSNAP_GPUSHARE_SCRATCH_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPUSNAP_GPUSHARE_MARK_SCRATCH "gpusnap_gpushare_mark_scratch"
#define GPUSNAP_GPUSHARE_UNMARK_SCRATCH "gpusnap_gpushare_unmark_scratch"
#define GPUSNAP_GPUSHARE_LOADS "gpusnap_gpushare_loads"

/* Marks [ptr, ptr + bytes) as scratch. ptr is a CUdeviceptr (what cudaMalloc
 * returns, torch.Tensor.data_ptr()). */
int gpusnap_gpushare_mark_scratch(unsigned long long ptr, size_t bytes);

/* Takes the marks off [ptr, ptr + bytes): the chunks it touches are saved
 * again from the next release on. For memory handed to other data while the
 * allocation lives (a caching allocator reusing a freed block). Errors as
 * for the mark; unmarking a range never marked is not one. */
int gpusnap_gpushare_unmark_scratch(unsigned long long ptr, size_t bytes);

/* How many times the shim has filled this process's device memory again from
 * the chunk store: 0 in a process that never went through a release, one more
 * after each restore, resume in place, or return of a checkpoint's source.
 * Each time, the scratch chunks were zeroed: a server that sees the number
 * change forgets what it kept in its scratch memory (a prefix cache).
 * Never fails. */
unsigned long long gpusnap_gpushare_loads(void);

typedef int (*gpusnap_gpushare_mark_scratch_fn)(unsigned long long ptr, size_t bytes);
typedef unsigned long long (*gpusnap_gpushare_loads_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* GPUSNAP_GPUSHARE_SCRATCH_H_ */
