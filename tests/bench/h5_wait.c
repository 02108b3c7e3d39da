/* h5_wait — how long the training loop's HDF5 read waits while a background thread writes
 * a checkpoint array (docs/design.md, "Asynchronous save"): the thread-safe HDF5 library
 * runs one call at a time, so the read waits for the writer's current call.
 *
 * The writer thread writes ARRAYS arrays of MB megabytes each (7B's blocks are 404 MB in
 * bf16) into new files in DIR, alternately through ftk's writer (h5w_write_tensor: H5Dwrite
 * in pieces of 4 MiB, each hashed) and the peer, one H5Dwrite of the whole array then its
 * hash (what HDF5 code does by default; ftk did until 2026-11-23). Meanwhile the main thread reads 8 rows of a small
 * dataset every 2 ms, as the trainer reads a step's rows, and keeps each read's wait. One
 * line per method: the reads, their mean and worst wait, and the writes' throughput; then
 * the ratio of the worst waits.
 *
 *   h5_wait DIR [MB] [ARRAYS]      (make bench: tests/bench/run.sh)
 */
#include <hdf5.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../formats/h5.h"
#include "../../libcommon/hash.h"
#include "../../libcommon/log.h"
#include "../../libcommon/timer.h"

static const char *dir;
static size_t n_elems;
static int n_arrays, whole; /* whole: the peer (one H5Dwrite) */
static float *data;
static volatile int writing;
static double write_s;

static void *writer(void *arg)
{
    (void)arg;
    double t0 = time_now();
    for (int k = 0; k < n_arrays; k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/h5_wait_%d.h5", dir, k);
        hid_t f = h5_create(path, "h5-wait", 1);
        hsize_t dims[1] = {n_elems};
        if (f < 0) {
            fprintf(stderr, "h5_wait: %s\n", ftk_err_msg());
            break;
        }
        if (!whole) {
            h5w_write_tensor(f, "x", H5T_NATIVE_FLOAT, 1, dims, data, NULL, NULL);
        } else {
            hid_t sp = H5Screate_simple(1, dims, NULL);
            hid_t d = H5Dcreate2(f, "x", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
            volatile uint64_t sum = hash_bytes(data, n_elems * sizeof *data); /* as ftk hashes */
            (void)sum;
            H5Dclose(d);
            H5Sclose(sp);
        }
        h5_close(f);
        unlink(path);
    }
    write_s = time_now() - t0;
    writing = 0;
    return NULL;
}

/* One method's run: the reads' mean and worst wait in ms. */
static void run(hid_t small, const char *name, double *worst)
{
    int32_t rows[32];
    double sum = 0;
    long n = 0;
    *worst = 0;
    writing = 1;
    pthread_t t;
    pthread_create(&t, NULL, writer, NULL);
    while (writing) {
        double t0 = time_now();
        h5r_read_rows(small, "rows", H5T_NATIVE_INT32, 3, 8, rows);
        double dt = time_now() - t0;
        sum += dt;
        n++;
        if (dt > *worst)
            *worst = dt;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    pthread_join(t, NULL);
    printf("%-34s %5ld reads, wait mean %7.2f ms, worst %8.1f ms; writes %6.0f MB/s\n", name, n, 1e3 * sum / n,
           1e3 * *worst, (double)n_arrays * n_elems * sizeof *data / 1e6 / write_s);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: h5_wait DIR [MB] [ARRAYS]\n");
        return 2;
    }
    dir = argv[1];
    n_elems = (size_t)(argc > 2 ? atol(argv[2]) : 400) * 1000000 / sizeof(float);
    n_arrays = argc > 3 ? atoi(argv[3]) : 4;
    hbool_t ts = 0;
    if (h5_init() < 0 || H5is_library_threadsafe(&ts) < 0 || !ts) {
        fprintf(stderr, "h5_wait: skipped (HDF5 is not the thread-safe build)\n");
        return 77;
    }
    if (!(data = malloc(n_elems * sizeof *data))) {
        fprintf(stderr, "h5_wait: skipped (no memory for %zu MB)\n", n_elems * sizeof *data / 1000000);
        return 77;
    }
    for (size_t i = 0; i < n_elems; i++)
        data[i] = (float)(i % 8191);
    char path[4200];
    snprintf(path, sizeof path, "%s/h5_wait_small.h5", dir);
    hid_t f = h5_create(path, "h5-wait", 1);
    int32_t rows[256 * 4] = {0};
    hsize_t d[2] = {256, 4};
    if (f < 0 || h5w_write_tensor(f, "rows", H5T_NATIVE_INT32, 2, d, rows, NULL, NULL) < 0 || h5_close(f) < 0) {
        fprintf(stderr, "h5_wait: %s\n", ftk_err_msg());
        return 1;
    }
    hid_t small = h5_open(path, "h5-wait", 1, NULL, NULL);
    printf("h5_wait: %d arrays of %zu MB written by a thread, 8 rows read every 2 ms beside it\n", n_arrays,
           n_elems * sizeof *data / 1000000);
    double w_ftk, w_peer;
    whole = 1;
    run(small, "one H5Dwrite per array (peer)", &w_peer);
    whole = 0;
    run(small, "ftk (h5w_write_tensor: 4 MiB pieces)", &w_ftk);
    printf("worst wait: peer / ftk = %.0fx\n", w_ftk > 0 ? w_peer / w_ftk : 0.0);
    h5_close(small);
    unlink(path);
    free(data);
    return 0;
}
