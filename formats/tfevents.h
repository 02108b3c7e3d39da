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
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *             Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 *
 * The first record is an Event with file_version "brain.Event:2". The file is named
 * `events.out.tfevents.<unix seconds>.<host>.<pid>` inside the directory given, as
 * TensorBoard expects; a resumed run starts a new file (TensorBoard merges the files of a
 * directory by wall time and step).
 *
 * Each scalar is one record, flushed at once, so a killed run loses nothing written.
 * Functions return 0 / a pointer, or -1 / NULL with ftk_err_msg() set.
 */
#ifndef FTK_TFEVENTS_H
#define FTK_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct tfevents tfevents_t;

/* Creates dir if needed (one level) and a new event file in it. */
tfevents_t *tfevents_open(const char *dir);
int tfevents_scalar(tfevents_t *t, const char *tag, int64_t step, double wall_time, float value);
/* Closes the file; -1 if a write or the close failed. NULL is fine. */
int tfevents_close(tfevents_t *t);

/* CRC-32C (Castagnoli) of len bytes, continuing from crc (0 to start). */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);

#endif
