/* cudnn_graphs.cu — FTK_CUDA_ATTN=cudnn's graphs (kernels/cuda/attention_cudnn.cu) given to
 * cuDNN without a GPU, for Llama's shapes (head dims 64 and 128, grouped-query heads or not,
 * several batches and lengths), forward and backward, and an H100's device properties (a
 * descriptor from JSON, cuDNN 9.8 on).
 *
 * What a run without a GPU proves, and what it does not:
 *  - proved: every tensor and operation descriptor of both graphs finalizes (cuDNN checks
 *    each attribute: types, dimensions against strides, the ragged offsets, the wiring of
 *    each operation's inputs), and so does the operation graph;
 *  - proved: some of cuDNN's engines (those that finalize for the graph and the device:
 *    the fused-attention engines, by its pattern matcher) recognise the graph's structure;
 *    a graph with an operation left out or a wire crossed is taken by none;
 *  - NOT proved: that any engine configuration takes the shape. Finalizing a configuration
 *    runs its isSupported(), which first loads the engine's kernels (loadDLL(), compiling
 *    them with NVRTC) and stops there without libcuda, before the per-configuration checks
 *    (head dimension, sequence length, shared memory, the deterministic backward's limits)
 *    run: so without a driver every shape reports the same count (cuDNN 9.19: 102 forward,
 *    37 backward configurations), whatever it is. Those counts are printed as "stopped at
 *    the driver", and say nothing about the shape. cuDNN's debug log shows it
 *    (CUDNN_LOGLEVEL_DBG=3: "this->libcuda == nullptr ... loadDLL() ... isSupported()").
 *  - NOT proved: the operations' modes within a recognised structure (cuDNN 9.19 takes an
 *    ADD where the backward has a SUB), the kernels, and what they compute: tests/gpu/gpu_ops.c
 *    with FTK_CUDA_ATTN=cudnn FTK_CUDNN_STRICT=1 on a GPU, where a refused plan is an error
 *    naming its shape.
 * With a driver (on a GPU machine) the configurations' own checks run, and a shape that
 * none takes fails here.
 *
 * Exit 0 pass, 1 fail, 77 "skipped" (no libcudnn.so.9 found, or one older than 9.8). */
#include "../../kernels/cuda/attention_cudnn.cu"

/* what attention_cudnn.cu calls in the rest of the backend, never reached here */
void *scratch(cuda_t *, void **, size_t *, size_t, const char *) { return NULL; }
cudaError_t host_wait(cuda_t *, cudaStream_t, cudaEvent_t) { return cudaSuccess; }

/* an H100 SXM's properties, as cuDNN's device-properties JSON names them */
static const char h100[] =
    "{\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64],\"regsPerBlock\":65536,"
    "\"multiProcessorCount\":132,\"warpSize\":32,\"maxSharedMemoryPerBlock\":49152,"
    "\"maxSharedMemoryPerBlockOptin\":232448,\"reservedSharedMemoryPerBlock\":1024,\"maxRegistersPerSM\":65536,"
    "\"maxCtasPerSM\":32,\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,\"pciDeviceId\":0,\"isTccDriver\":0,"
    "\"supportCoopLaunch\":1,\"totalGlobalMem\":84987740160,\"smClockRateKHz\":1980000,\"memClockRateKHz\":2619000,"
    "\"l2CacheSize\":52428800,\"cudaDeviceId\":0,\"deviceVer\":900,\"driverVer\":13000,"
    "\"deviceName\":\"NVIDIA H100 80GB HBM3\"}";

static int failures, unchecked;

/* How many of cuDNN's engine configurations (each engine, each value of its KERNEL_CFG knob)
 * take g's ops on device dp: finalizing a configuration checks the graph against the
 * engine's pattern and limits, then loads its kernels, which needs the driver; a
 * configuration that gets that far (CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING
 * without one) counts, in *need_driver too. -1 with g.err set when the graph is refused
 * before that. */
static int accepted(gb &g, desc_t dp, int *need_driver)
{
    const char *w = "operation graph";
    desc_t og = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, w);
    g.set(og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)g.ops.size(), g.ops.data(), w);
    g.fin(og, w);
    int64_t n_eng = 0, got = 0;
    if (!g.err[0] && dnn_lib.cudnnBackendGetAttribute(og, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
                                                      CUDNN_TYPE_INT64, 1, &got, &n_eng) != CUDNN_STATUS_SUCCESS)
        snprintf(g.err, sizeof g.err, "the operation graph's engine count");
    if (g.err[0])
        return -1;
    int n = 0;
    *need_driver = 0;
    for (int64_t e = 0; e < n_eng; e++) {
        desc_t eng = g.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
        if (!eng)
            return -1;
        if (dnn_lib.cudnnBackendSetAttribute(eng, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                             &og) != CUDNN_STATUS_SUCCESS ||
            dnn_lib.cudnnBackendSetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &e) !=
                CUDNN_STATUS_SUCCESS ||
            dnn_lib.cudnnBackendSetAttribute(eng, CUDNN_ATTR_ENGINE_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                             &dp) != CUDNN_STATUS_SUCCESS ||
            dnn_lib.cudnnBackendFinalize(eng) != CUDNN_STATUS_SUCCESS)
            continue;
        /* the KERNEL_CFG knob's range; one configuration (the defaults) where there is none */
        int64_t lo = 0, hi = 0, st = 1;
        desc_t ki[32];
        int64_t n_ki = 0;
        for (auto &k : ki)
            k = g.make(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR, "knob info");
        if (g.err[0])
            return -1;
        int has_cfg = 0;
        if (dnn_lib.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR, 32, &n_ki,
                                             ki) == CUDNN_STATUS_SUCCESS)
            for (int64_t j = 0; j < n_ki && !has_cfg; j++) {
                cudnnBackendKnobType_t t;
                int64_t c;
                if (dnn_lib.cudnnBackendGetAttribute(ki[j], CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &c,
                                                     &t) != CUDNN_STATUS_SUCCESS ||
                    t != CUDNN_KNOB_TYPE_KERNEL_CFG)
                    continue;
                has_cfg = dnn_lib.cudnnBackendGetAttribute(ki[j], CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64,
                                                           1, &c, &lo) == CUDNN_STATUS_SUCCESS &&
                          dnn_lib.cudnnBackendGetAttribute(ki[j], CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64,
                                                           1, &c, &hi) == CUDNN_STATUS_SUCCESS &&
                          dnn_lib.cudnnBackendGetAttribute(ki[j], CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &c,
                                                           &st) == CUDNN_STATUS_SUCCESS &&
                          st > 0 && hi - lo < 4096;
            }
        if (!has_cfg)
            lo = hi = 0, st = 1;
        for (int64_t v = lo; v <= hi; v += st) {
            desc_t cfg = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
            if (!cfg)
                return -1;
            dnn_lib.cudnnBackendSetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &eng);
            if (has_cfg) {
                desc_t kc = g.make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, "knob choice");
                cudnnBackendKnobType_t t = CUDNN_KNOB_TYPE_KERNEL_CFG;
                g.set(kc, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &t, "knob choice");
                g.set(kc, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &v, "knob choice");
                g.fin(kc, "knob choice");
                g.setd(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, kc, "engine configuration");
                if (g.err[0])
                    return -1;
            }
            cudnnStatus_t s = dnn_lib.cudnnBackendFinalize(cfg);
            n += s == CUDNN_STATUS_SUCCESS || s == CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING;
            *need_driver += s == CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING;
        }
    }
    return n;
}

int main(void)
{
    if (dnn_load() < 0) {
        printf("skipped (%s)\n", dnn_lib.why);
        return 77;
    }
    if (dnn_lib.version < 90800) {
        printf("skipped (%s is cuDNN %zu: device properties from JSON need 9.8)\n", dnn_lib.path, dnn_lib.version);
        return 77;
    }
    printf("cuDNN %zu (%s)\n", dnn_lib.version, dnn_lib.path);
    desc_t dp = NULL;
    if (dnn_lib.cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &dp) != CUDNN_STATUS_SUCCESS ||
        dnn_lib.cudnnBackendSetAttribute(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                         (int64_t)strlen(h100), h100) != CUDNN_STATUS_SUCCESS ||
        dnn_lib.cudnnBackendFinalize(dp) != CUDNN_STATUS_SUCCESS) {
        char m[256] = "";
        dnn_lib.cudnnGetLastErrorString(m, sizeof m);
        printf("FAIL the H100's device properties are refused: %s\n", m);
        return 1;
    }
    /* batch, query heads, key/value heads, sequence, head dim: Llama-2-7B's at 8 × 512, a
     * packed micro-batch's many short segments, Llama-3-8B's grouped heads, a small model's */
    static const int64_t shapes[][5] = {{8, 32, 32, 512, 128}, {64, 32, 32, 128, 128}, {4, 32, 8, 1024, 128},
                                        {2, 8, 2, 64, 64},     {1, 4, 4, 2048, 64}};
    for (const auto &sh : shapes)
        for (int bwd = 0; bwd < 2; bwd++) {
            gb g;
            sdpa_dims z{sh[0], sh[1], sh[2], sh[3], sh[4]};
            if (bwd)
                bwd_graph(g, z);
            else
                fwd_graph(g, z);
            int drv = 0, n = g.err[0] ? -1 : accepted(g, dp, &drv);
            int ok = n > 0;
            printf("%-4s %s graph, batch %lld, %lld/%lld heads, sequence %lld, head dim %lld: %zu ops, ", ok ? "ok" : "FAIL",
                   bwd ? "backward" : "forward", (long long)z.B, (long long)z.H, (long long)z.Hk, (long long)z.S,
                   (long long)z.D, g.ops.size());
            if (n < 0)
                printf("%s\n", g.err);
            else if (n == drv)
                printf("descriptors and operation graph finalize, the structure recognised; %d engine "
                       "configurations stopped at the driver before their checks of the shape: not checked\n", n);
            else
                printf("%d engine configurations take it on an H100 (checked; %d more stopped at the driver)\n",
                       n - drv, drv);
            unchecked += n > 0 && n == drv;
            failures += !ok;
            for (desc_t d : g.all)
                dnn_lib.cudnnBackendDestroyDescriptor(d);
        }
    dnn_lib.cudnnBackendDestroyDescriptor(dp);
    if (unchecked)
        printf("%d graph%s not checked per engine configuration: no driver (libcuda), so cuDNN stopped in "
               "isSupported() -> loadDLL() before the shape's checks\n",
               unchecked, unchecked == 1 ? "" : "s");
    printf("%d failure%s\n", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
