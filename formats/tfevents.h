/* tfevents.h — TensorBoard event files (scalars), written without TensorFlow.
 *
 * Format (TensorFlow's TFRecord framing of `Event` protocol buffers; what TensorBoard,
 * torch.utils.tensorboard and LitGPT's TensorBoard logger write and read):
 *
 *   file    = record*
 *   record  = uint64 length (little-endian)
 *             uint32 masked_crc32c(the 8 length bytes)
 *             byte   data[length]            (a serialized Event)
 *             uint32 masked_crc32c(data)
 *   masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8   (c = CRC-32C, Castagnoli)
 *
 *   Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
 *                Summary summary = 5; SessionLog session_log = 7; }
 *   Summary    { repeated Value value = 1; }
 *   Value      { string tag = 1; float simple_value = 2; }
 *   SessionLog { enum status = 1 (START = 1); }
 *
 * A file begins with an Event with file_version "brain.Event:2", then a SessionLog START
 * at the first step the process will write. The file is named
 * `events.out.tfevents.<unix seconds>.<host>.<pid>` inside the directory given, as
 * TensorBoard expects; each process of a run (a resume) starts a new file.
 *
 * A resumed run's history: before it opens its file, the trainer trims every event file
 * of the directory to the checkpoint's step (tfevents_trim), as it trims metrics.jsonl,
 * so the steps a killed process wrote after its last checkpoint are gone from the files
 * and no reader sees a step twice. A TensorBoard already running has read them: the
 * START record tells it to drop what it holds from that step on (TensorBoard purges
 * "orphaned" events after a restart so), so it shows one history too.
 *
 * Each record is flushed at once, so a killed run loses nothing written; a torn last
 * record is what readers (and tfevents_trim) stop at.
 * Functions return 0 / a pointer, or -1 / NULL with ftk_err_msg() set (naming the file).
 */
#ifndef FTK_TFEVENTS_H
#define FTK_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct tfevents tfevents_t;

/* Creates dir if needed (one level) and a new event file in it. first_step >= 0: the
 * file's START record says it, the first step this process writes (a run continuing a
 * history); < 0: no START record (a new run: what TensorBoard shows of other files in the
 * directory stays). On failure nothing is left (no empty file; dir removed when this
 * call made it). */
tfevents_t *tfevents_open(const char *dir, int64_t first_step);
/* Keeps, in each event file of dir (events.out.tfevents.*: regular files; links and
 * anything else are left alone), the records of steps <= step and the file_version
 * records, in their order; a file loses its records from a torn or damaged one on (CRC
 * or framing: no reader gets past it). A file that changes is replaced atomically, or
 * removed when it keeps nothing but its version record; the others are not touched. A
 * missing dir is nothing to trim. Files are read whole: at most 1 GiB each (EFBIG). */
int tfevents_trim(const char *dir, int64_t step);
int tfevents_scalar(tfevents_t *t, const char *tag, int64_t step, double wall_time, float value);
/* Closes the file; -1 if a write or the close failed. NULL is fine. */
int tfevents_close(tfevents_t *t);
/* Closes and removes the file, and the directory when tfevents_open() made it and it is
 * empty (a failed run that leaves nothing behind). -1 if the file could not be removed.
 * NULL is fine. */
int tfevents_discard(tfevents_t *t);

/* CRC-32C (Castagnoli) of len bytes, continuing from crc (0 to start). */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);

#endif
