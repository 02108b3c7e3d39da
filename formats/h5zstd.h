/* h5zstd.h — the Zstandard HDF5 filter, registered id 32015.
 *
 * On-disk form (the same as the registered filter used by hdf5plugin, h5py and others):
 * each chunk is one complete zstd frame (ZSTD_compress output, content size recorded in the
 * frame header). cd_values[0], when present, is the compression level used to write; a
 * reader does not need it. Frames without a content size are also decoded (streaming).
 *
 * The same source builds the in-process filter (h5zstd_register(), called by every ftk
 * writer and reader) and, with -DH5ZSTD_PLUGIN, the dynamically loaded plugin library
 * (build/plugin/libh5zstd.so) for h5dump, h5py and other HDF5 tools:
 *     HDF5_PLUGIN_PATH=build/plugin h5dump file.h5
 */
#ifndef FTK_H5ZSTD_H
#define FTK_H5ZSTD_H

#define H5Z_FILTER_ZSTD 32015

/* Registers the filter with the HDF5 library of this process (idempotent). Returns 0, or
 * -1 with ftk_err_msg() set. */
int h5zstd_register(void);

#endif
