/*
 * SIMULATION: a stand-in for NVIDIA's libnvidia-ml.so.1 (NVML) for the gpuprov lab.
 *
 * The lab's nodes have no GPU, no kernel module and no /dev/nvidia*. This library answers
 * the part of the NVML C API that gpuprov uses (through pynvml, unchanged) from a plain
 * text description of the node's GPUs, so code under test runs its production path.
 * What it does not do is listed in gpuprov/lab/SIMULATION.md. Functions that are not
 * here do not exist, as in an older driver: pynvml raises NVMLError_FunctionNotFound.
 *
 * Configuration, re-read at every nvmlInit, in $GPUPROV_SIM_DIR (default /etc/gpuprov-sim):
 *   nvml.conf  "key = value" lines; global keys first, then one "[gpu]" section per GPU in
 *              NVML index order (written by gpuprov/lab/simhw.py; keys listed in GLOBAL_KEYS
 *              and parse_gpu_key below). No nvml.conf: nvmlInit says the driver is not loaded.
 *   faults     one "name [gpu-index]" per line (registry: gpuprov/lab/faults.py).
 * Visible GPUs: by /dev/nvidia<minor> device nodes, or GPUPROV_SIM_CONTAINER_GPUS
 * (apply_visible_devices). GPUPROV_SIM_CONTAINER_GPUS filters and re-indexes GPUs as a container
 * given those GPUs by NVIDIA's container runtime would see them; a MIG device's UUID in it gives
 * the container its parent GPU with only the MIG devices listed (mig_visible). The lab's kubelet sets it from
 * NVIDIA's rules (gpuprov/lab/toolkit_rules.py), standing in for the /dev/nvidia<N> device
 * nodes the real runtime mounts: a container's own NVIDIA_VISIBLE_DEVICES is only a request,
 * which the runtime may refuse, so the library does not read it.
 *
 * Build: gcc -shared -fPIC -O2 -Wall -Wextra -Werror -Wl,-soname,libnvidia-ml.so.1
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/types.h>
#include <unistd.h>

/* ---- NVML ABI (values and layouts as in nvml.h) --------------------------------------- */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct sim_gpu *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)

typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_v1_t;
#define nvmlTemperature_v1 NVML_STRUCT_VERSION(sizeof(nvmlTemperature_v1_t), 1)

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t; /* nvmlProcessInfo_v2_t, used by the _v2 and _v3 calls */

#define NVML_TEMPERATURE_GPU 0
#define NVML_TEMPERATURE_THRESHOLD_SHUTDOWN 0
#define NVML_TEMPERATURE_THRESHOLD_SLOWDOWN 1
#define NVML_TEMPERATURE_THRESHOLD_GPU_MAX 3
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_MEMORY_ERROR_TYPE_COUNT 2
#define NVML_ECC_COUNTER_TYPE_COUNT 2
#define NVML_MEMORY_LOCATION_DEVICE_MEMORY 2
#define NVML_MEMORY_LOCATION_COUNT 8
#define NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR 1
#define NVML_PAGE_RETIREMENT_CAUSE_COUNT 2
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu

#define REASON_GPU_IDLE 0x1ULL
#define REASON_HW_SLOWDOWN 0x8ULL
#define REASON_SW_THERMAL 0x20ULL
#define REASON_HW_THERMAL 0x40ULL
#define REASONS_SUPPORTED 0x1FFULL /* idle ... display clock setting */

/* ---- the simulated node --------------------------------------------------------------- */
#define MAX_GPUS 16
#define MAX_PROCS 32
#define MAX_BRANCHES 32
#define LINE_MAX_LEN 512
#define HOT_ABOVE_SLOWDOWN 3                       /* degrees C */
#define RETIRED_PAGE_ADDRESS 0x000000000004a1c3ULL /* any page-aligned frame number */
#define RETIRED_PAGE_TIMESTAMP 1767225600ULL       /* 2026-01-01T00:00:00Z */

struct sim_proc {
    unsigned int pid;
    unsigned long long used;
};

/* MIG: a GPU instance profile of the GPU's model (nvml.conf mig_profiles, from
 * gpuprov/nvidia/mig.py), a GPU instance (GI) and a compute instance (CI) in it. A CI is what NVML
 * hands out as a MIG device (nvmlDevice_t pointing at the CI). Instances live in slots by
 * id, so a handle stays valid while its instance exists. */
#define MAX_MIG_PROFILES 8
#define MAX_GI 7 /* ids 1..7 */
#define MAX_CI 8 /* ids 0..7 */
#define MIG_MEMORY_SLICES 8

struct sim_mig_profile {
    unsigned int index; /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned int id;    /* the profile's ID (nvidia-smi mig -lgip) */
    char name[32];      /* "1g.10gb", "1g.10gb+me" */
    unsigned int compute, size, count, sm, starts_mask;
    unsigned long long memory_mb;
};

struct sim_ci {
    int used;
    unsigned int profile; /* NVML_COMPUTE_INSTANCE_PROFILE_*, also its id */
    unsigned int start, slices;
};

struct sim_gi {
    int used;
    const struct sim_mig_profile *profile;
    unsigned int start;
    struct sim_ci cis[MAX_CI];
};

struct sim_gpu {
    char name[96];
    char uuid[96];
    char serial[32];
    unsigned int domain, bus, device;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned long long memory_total, memory_used, memory_reserved;
    int cc_major, cc_minor;
    unsigned int architecture, brand, minor_number;
    unsigned int pcie_max_gen, pcie_max_width, pcie_curr_gen, pcie_curr_width;
    unsigned int power_limit_mw, power_usage_mw;
    unsigned int temperature, temp_shutdown, temp_slowdown, temp_gpu_max;
    int has_temp_gpu_max;
    unsigned int utilization_gpu, utilization_memory;
    int ecc, row_remapping;
    unsigned int nprocs;
    struct sim_proc procs[MAX_PROCS];
    /* faults */
    int lost, ecc_uncorrectable, remap_pending, hot;
    /* GPUPROV_SIM_CONTAINER_GPUS */
    int visible;
    unsigned int visible_index;
    int mig_only; /* visible for its MIG devices named there, and only those */
    int mig_caps; /* its MIG devices visible by their /dev/nvidia-caps nodes (mig_visible) */
    /* MIG: no profiles = not MIG-capable */
    unsigned int nmig_profiles, mig_boot_mode, mig_current, mig_pending, compute_slices;
    struct sim_mig_profile mig_profiles[MAX_MIG_PROFILES];
    struct sim_gi gis[MAX_GI + 1]; /* by id; slot 0 unused */
};

struct sim_state {
    char driver_version[80];
    char node_root[PATH_MAX];
    char persistence_mode[8]; /* auto | 0 | 1 */
    unsigned int branches[MAX_BRANCHES];
    int branch_cuda[MAX_BRANCHES];
    unsigned int nbranches;
    int fault_init_fail, fault_version_mismatch;
    int cuda_driver_version;
    int persistence;
    struct sim_gpu gpus[MAX_GPUS];
    unsigned int ngpus;
    struct sim_gpu *visible[MAX_GPUS];
    unsigned int nvisible;
    /* The MIG device UUIDs GPUPROV_SIM_CONTAINER_GPUS names (mig_visible). */
    char mig_tokens[MAX_GPUS * 7][96];
    unsigned int nmig_tokens;
};

static struct sim_state S;
static unsigned int refcount;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Problems in the simulation's own files are lab bugs, not simulated failures: say so. */
static void complain(const char *fmt, ...)
{
    va_list ap;
    fputs("gpuprov simulated NVML: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static char *trim(char *s)
{
    char *end;
    while (isspace((unsigned char)*s))
        s++;
    end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

static int parse_u64(const char *s, unsigned long long *out)
{
    char *end;
    if (*s == '\0' || *s == '-')
        return -1;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return (errno || *end != '\0') ? -1 : 0;
}

static int parse_uint(const char *s, unsigned int *out)
{
    unsigned long long v;
    if (parse_u64(s, &v) || v > UINT_MAX)
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int copy_value(char *dst, size_t size, const char *value)
{
    size_t n = strlen(value);
    if (n + 1 > size)
        return -1;
    memcpy(dst, value, n + 1);
    return 0;
}

static int parse_branches(struct sim_state *st, char *value)
{
    char *save = NULL;
    for (char *tok = strtok_r(value, " \t,", &save); tok; tok = strtok_r(NULL, " \t,", &save)) {
        char *colon = strchr(tok, ':');
        unsigned int branch, cuda;
        if (!colon || st->nbranches >= MAX_BRANCHES)
            return -1;
        *colon = '\0';
        if (parse_uint(tok, &branch) || parse_uint(colon + 1, &cuda) || cuda > INT_MAX)
            return -1;
        st->branches[st->nbranches] = branch;
        st->branch_cuda[st->nbranches++] = (int)cuda;
    }
    return 0;
}

static int parse_processes(struct sim_gpu *g, char *value)
{
    char *save = NULL;
    g->nprocs = 0;
    for (char *tok = strtok_r(value, " \t,", &save); tok; tok = strtok_r(NULL, " \t,", &save)) {
        char *colon = strchr(tok, ':');
        if (!colon || g->nprocs >= MAX_PROCS)
            return -1;
        *colon = '\0';
        if (parse_uint(tok, &g->procs[g->nprocs].pid) ||
            parse_u64(colon + 1, &g->procs[g->nprocs].used))
            return -1;
        g->nprocs++;
    }
    return 0;
}

static int parse_global_key(struct sim_state *st, const char *key, char *value)
{
    if (!strcmp(key, "driver_version"))
        return copy_value(st->driver_version, sizeof st->driver_version, value);
    if (!strcmp(key, "node_root"))
        return copy_value(st->node_root, sizeof st->node_root, value);
    if (!strcmp(key, "persistence_mode")) {
        if (strcmp(value, "auto") && strcmp(value, "0") && strcmp(value, "1"))
            return -1;
        return copy_value(st->persistence_mode, sizeof st->persistence_mode, value);
    }
    if (!strcmp(key, "cuda_driver_version_by_branch"))
        return parse_branches(st, value);
    return -2;
}

#define UINT_KEY(k, field) \
    if (!strcmp(key, k))   \
    return parse_uint(value, &g->field)

/* mig_profiles = index:id:name:compute:size:count:sm:memory_mb:start,start,...;... */
static int parse_mig_profiles(struct sim_gpu *g, char *value)
{
    char *save = NULL;
    for (char *item = strtok_r(value, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        struct sim_mig_profile *p;
        char starts[64], extra;
        char *save2 = NULL;
        if (g->nmig_profiles >= MAX_MIG_PROFILES)
            return -1;
        p = &g->mig_profiles[g->nmig_profiles++];
        if (sscanf(trim(item), "%u:%u:%31[^:]:%u:%u:%u:%u:%llu:%63[0-9,]%c", &p->index, &p->id,
                   p->name, &p->compute, &p->size, &p->count, &p->sm, &p->memory_mb, starts,
                   &extra) != 9)
            return -1;
        for (char *t = strtok_r(starts, ",", &save2); t; t = strtok_r(NULL, ",", &save2)) {
            unsigned int start;
            if (parse_uint(t, &start) || start + p->size > MIG_MEMORY_SLICES)
                return -1;
            p->starts_mask |= 1u << start;
        }
    }
    return 0;
}

static int parse_gpu_key(struct sim_gpu *g, const char *key, char *value)
{
    if (!strcmp(key, "name"))
        return copy_value(g->name, sizeof g->name, value);
    if (!strcmp(key, "uuid"))
        return copy_value(g->uuid, sizeof g->uuid, value);
    if (!strcmp(key, "serial"))
        return copy_value(g->serial, sizeof g->serial, value);
    if (!strcmp(key, "pci_bus_id")) {
        char extra;
        unsigned int fn;
        return sscanf(value, "%x:%x:%x.%x%c", &g->domain, &g->bus, &g->device, &fn, &extra) == 4
                   ? 0
                   : -1;
    }
    if (!strcmp(key, "memory_total"))
        return parse_u64(value, &g->memory_total);
    if (!strcmp(key, "memory_used"))
        return parse_u64(value, &g->memory_used);
    if (!strcmp(key, "memory_reserved"))
        return parse_u64(value, &g->memory_reserved);
    if (!strcmp(key, "compute_capability")) {
        char extra;
        return sscanf(value, "%d.%d%c", &g->cc_major, &g->cc_minor, &extra) == 2 ? 0 : -1;
    }
    if (!strcmp(key, "temp_gpu_max")) {
        g->has_temp_gpu_max = 1;
        return parse_uint(value, &g->temp_gpu_max);
    }
    if (!strcmp(key, "ecc"))
        return parse_uint(value, (unsigned int *)&g->ecc);
    if (!strcmp(key, "row_remapping"))
        return parse_uint(value, (unsigned int *)&g->row_remapping);
    if (!strcmp(key, "processes"))
        return parse_processes(g, value);
    if (!strcmp(key, "mig_profiles"))
        return parse_mig_profiles(g, value);
    UINT_KEY("mig_mode", mig_boot_mode);
    UINT_KEY("mig_compute_slices", compute_slices);
    UINT_KEY("pci_device_id", pci_device_id);
    UINT_KEY("pci_subsystem_id", pci_subsystem_id);
    UINT_KEY("architecture", architecture);
    UINT_KEY("brand", brand);
    UINT_KEY("minor_number", minor_number);
    UINT_KEY("pcie_max_gen", pcie_max_gen);
    UINT_KEY("pcie_max_width", pcie_max_width);
    UINT_KEY("pcie_curr_gen", pcie_curr_gen);
    UINT_KEY("pcie_curr_width", pcie_curr_width);
    UINT_KEY("power_limit_mw", power_limit_mw);
    UINT_KEY("power_usage_mw", power_usage_mw);
    UINT_KEY("temperature", temperature);
    UINT_KEY("temp_shutdown", temp_shutdown);
    UINT_KEY("temp_slowdown", temp_slowdown);
    UINT_KEY("utilization_gpu", utilization_gpu);
    UINT_KEY("utilization_memory", utilization_memory);
    return -2;
}

/* 0: read; NVML_ERROR_DRIVER_NOT_LOADED: no nvml.conf (no driver); else NVML_ERROR_UNKNOWN */
static nvmlReturn_t read_config(struct sim_state *st, const char *dir)
{
    char path[PATH_MAX], line[LINE_MAX_LEN + 2];
    unsigned int lineno = 0;
    struct sim_gpu *g = NULL;
    FILE *f;

    if (snprintf(path, sizeof path, "%s/nvml.conf", dir) >= (int)sizeof path)
        return NVML_ERROR_UNKNOWN;
    f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR)
            return NVML_ERROR_DRIVER_NOT_LOADED;
        complain("cannot read %s: %s", path, strerror(errno));
        return NVML_ERROR_UNKNOWN;
    }
    while (fgets(line, sizeof line, f)) {
        char *s, *eq, *key, *value;
        int rc;
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            complain("%s:%u: line longer than %d characters", path, lineno, LINE_MAX_LEN);
            fclose(f);
            return NVML_ERROR_UNKNOWN;
        }
        s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        if (!strcmp(s, "[gpu]")) {
            if (st->ngpus >= MAX_GPUS) {
                complain("%s:%u: more than %d GPUs", path, lineno, MAX_GPUS);
                fclose(f);
                return NVML_ERROR_UNKNOWN;
            }
            g = &st->gpus[st->ngpus++];
            continue;
        }
        eq = strchr(s, '=');
        if (!eq) {
            complain("%s:%u: expected key = value or [gpu]", path, lineno);
            fclose(f);
            return NVML_ERROR_UNKNOWN;
        }
        *eq = '\0';
        key = trim(s);
        value = trim(eq + 1);
        rc = g ? parse_gpu_key(g, key, value) : parse_global_key(st, key, value);
        if (rc) {
            complain("%s:%u: %s key %s", path, lineno, rc == -2 ? "unknown" : "bad value for",
                     key);
            fclose(f);
            return NVML_ERROR_UNKNOWN;
        }
    }
    fclose(f);
    for (unsigned int i = 0; i < st->ngpus; i++) {
        if (!st->gpus[i].name[0] || !st->gpus[i].uuid[0]) {
            complain("%s: GPU %u has no name or uuid", path, i);
            return NVML_ERROR_UNKNOWN;
        }
    }
    return NVML_SUCCESS;
}

static void read_faults(struct sim_state *st, const char *dir)
{
    char path[PATH_MAX], line[LINE_MAX_LEN + 2];
    FILE *f;

    if (snprintf(path, sizeof path, "%s/faults", dir) >= (int)sizeof path)
        return;
    f = fopen(path, "r");
    if (!f)
        return; /* no faults file: no faults */
    while (fgets(line, sizeof line, f)) {
        char name[64], extra;
        unsigned int index = 0;
        struct sim_gpu *g;
        char *s = trim(line);
        int n;
        if (*s == '\0' || *s == '#')
            continue;
        n = sscanf(s, "%63s %u %c", name, &index, &extra);
        if (n < 1 || n > 2) {
            complain("%s: ignoring malformed line: %s", path, s);
            continue;
        }
        if (!strcmp(name, "nvml-init-fail")) {
            st->fault_init_fail = 1;
            continue;
        }
        if (!strcmp(name, "version-mismatch")) {
            st->fault_version_mismatch = 1;
            continue;
        }
        if (index >= st->ngpus) {
            complain("%s: ignoring %s on GPU %u: the node has %u GPUs", path, name, index,
                     st->ngpus);
            continue;
        }
        g = &st->gpus[index];
        if (!strcmp(name, "gpu-lost"))
            g->lost = 1;
        else if (!strcmp(name, "ecc-uncorrectable"))
            g->ecc_uncorrectable = 1;
        else if (!strcmp(name, "row-remap-pending"))
            g->remap_pending = 1;
        else if (!strcmp(name, "hot-gpu"))
            g->hot = 1;
        else if (!strncmp(name, "xid-", 4) || !strcmp(name, "fallen-off-bus") ||
                 !strcmp(name, "gpu-reset"))
            ; /* kernel log faults: simhw.py writes them to the node's simulated /dev/kmsg */
        else
            complain("%s: ignoring unknown fault %s", path, name);
    }
    fclose(f);
}

/* Compare dotted versions numerically ("535.261.03" > "535.54.03"). */
static int version_cmp(const char *a, const char *b)
{
    while (*a || *b) {
        unsigned long x = strtoul(a, (char **)&a, 10), y = strtoul(b, (char **)&b, 10);
        if (x != y)
            return x < y ? -1 : 1;
        if (*a == '.')
            a++;
        if (*b == '.')
            b++;
        if ((*a && !isdigit((unsigned char)*a)) || (*b && !isdigit((unsigned char)*b)))
            break;
    }
    return 0;
}

static int is_driver_version(const char *v)
{
    int dots = 0;
    if (!isdigit((unsigned char)*v))
        return 0;
    for (; *v; v++) {
        if (*v == '.') {
            if (!isdigit((unsigned char)v[1]))
                return 0;
            dots++;
        } else if (!isdigit((unsigned char)*v)) {
            return 0;
        }
    }
    return dots >= 1;
}

/*
 * The version of a real NVIDIA user-space driver installed on the node, so that package
 * installs and upgrades in the lab show in NVML as they would on a server: Debian installs
 * usr/lib/x86_64-linux-gnu/nvidia/<flavour>/libnvidia-ml.so.<version> (current, tesla-470,
 * ...); NVIDIA's and Ubuntu's packages the same name in the multiarch directory; RHEL in
 * usr/lib64. The newest one found wins.
 */
static int installed_driver_version(const char *root, char *out, size_t size)
{
    static const char *patterns[] = {
        "usr/lib/x86_64-linux-gnu/nvidia/*/libnvidia-ml.so.*",
        "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*",
        "usr/lib64/libnvidia-ml.so.*",
    };
    static const char prefix[] = "libnvidia-ml.so.";
    char best[80] = "";
    for (size_t p = 0; p < sizeof patterns / sizeof patterns[0]; p++) {
        char pattern[PATH_MAX];
        glob_t gl;
        int n = snprintf(pattern, sizeof pattern, "%s%s%s", root,
                         root[0] && root[strlen(root) - 1] == '/' ? "" : "/", patterns[p]);
        if (n < 0 || n >= (int)sizeof pattern)
            continue;
        if (glob(pattern, 0, NULL, &gl) != 0)
            continue;
        for (size_t i = 0; i < gl.gl_pathc; i++) {
            const char *base = strrchr(gl.gl_pathv[i], '/');
            const char *v = strstr(base ? base : gl.gl_pathv[i], prefix);
            if (!v)
                continue;
            v += sizeof prefix - 1;
            if (is_driver_version(v) && strlen(v) < sizeof best &&
                (!best[0] || version_cmp(v, best) > 0))
                memcpy(best, v, strlen(v) + 1);
        }
        globfree(&gl);
    }
    if (!best[0] || strlen(best) + 1 > size)
        return -1;
    memcpy(out, best, strlen(best) + 1);
    return 0;
}

/* The newest branch in the table that is not newer than the driver's. */
static int cuda_version_for(const struct sim_state *st, const char *driver)
{
    unsigned long branch = strtoul(driver, NULL, 10);
    unsigned int best = 0;
    int cuda = 0;
    for (unsigned int i = 0; i < st->nbranches; i++) {
        if (st->branches[i] <= branch && st->branches[i] >= best) {
            best = st->branches[i];
            cuda = st->branch_cuda[i];
        }
    }
    return cuda;
}

/* Persistence mode follows nvidia-persistenced, as on a server, unless pinned: Enabled while
 * it runs, or when it is enabled at boot. SIMULATION: a lab node cannot run the daemon (it
 * needs /dev/nvidiactl from a loaded kernel module); a server that starts it at boot has
 * persistence on from then on, so an enabled unit stands for a daemon that would run. */
static int persistence_enabled(const struct sim_state *st)
{
    char path[PATH_MAX], buf[32];
    struct stat link;
    FILE *f;
    long pid;
    if (strcmp(st->persistence_mode, "auto"))
        return !strcmp(st->persistence_mode, "1");
    if (snprintf(path, sizeof path,
                 "%s/etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service",
                 st->node_root) < (int)sizeof path && lstat(path, &link) == 0)
        return 1;
    if (snprintf(path, sizeof path, "%s/run/nvidia-persistenced/nvidia-persistenced.pid",
                 st->node_root) >= (int)sizeof path)
        return 0;
    f = fopen(path, "r");
    if (!f)
        return 0;
    pid = fgets(buf, sizeof buf, f) ? strtol(buf, NULL, 10) : 0;
    fclose(f);
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/* Whether <node_root>/dev/<name> exists. */
static int device_node_exists(const struct sim_state *st, const char *name)
{
    char path[PATH_MAX];
    struct stat sb;
    const char *root = strcmp(st->node_root, "/") ? st->node_root : "";
    return snprintf(path, sizeof path, "%s/dev/%s", root, name) < (int)sizeof path
           && stat(path, &sb) == 0;
}

static void mig_uuid(const struct sim_gpu *g, unsigned int gi, unsigned int ci, char *out,
                     size_t size);

/* The GPU a MIG device UUID belongs to (any GPU instance 1..7, compute instance 0..7 that
 * could exist: UUIDs are a hash of the three), or NULL. */
static struct sim_gpu *mig_parent(struct sim_state *st, const char *uuid)
{
    char buf[96];
    for (unsigned int i = 0; i < st->ngpus; i++)
        for (unsigned int gi = 1; gi <= 7; gi++)
            for (unsigned int ci = 0; ci < 8; ci++) {
                mig_uuid(&st->gpus[i], gi, ci, buf, sizeof buf);
                if (!strcasecmp(uuid, buf))
                    return &st->gpus[i];
            }
    return NULL;
}

/* Which GPUs this process sees.
 * GPUPROV_SIM_CONTAINER_GPUS set (by the lab's nvidia-container-runtime in legacy mode): "all":
 * every GPU; "", "none" or "void": none; else a comma list of indices, GPU UUIDs or MIG device
 * UUIDs. A MIG device UUID makes its parent GPU visible with only the MIG devices the list
 * names, as NVIDIA's container toolkit gives a container a MIG device: the parent's
 * /dev/nvidia<minor> and the /dev/nvidia-caps access nodes of that GPU and compute instance,
 * without which NVML does not enumerate the GPU's other MIG devices (libnvidia-container
 * src/cli/common.c select_mig_device; NVIDIA's MIG user guide, device nodes and
 * capabilities). Simplified: a GPU named itself (index or UUID) shows all its MIG devices.
 * Entries that match nothing are ignored.
 * Unset: by device nodes, as the real driver (a process opens /dev/nvidia<minor> for each GPU
 * it uses): where /dev/nvidiactl exists (a lab node, whose gpuprov-sim-devices.service makes
 * the nodes, or a container given GPUs through CDI, whose spec names them), the GPUs whose
 * /dev/nvidia<minor> exists. SIMULATION: without /dev/nvidiactl (the machine running the
 * tests, which has no NVIDIA device) every GPU, where the real library would fail to init.
 * The GPUs keep PCI order and are re-indexed from 0. */
static void apply_visible_devices(struct sim_state *st)
{
    const char *env = getenv("GPUPROV_SIM_CONTAINER_GPUS");
    char list[1024];
    char *save = NULL;
    int all = !env || !strcmp(env, "all");
    int by_nodes = !env && device_node_exists(st, "nvidiactl");

    /* By device nodes, MIG devices too: a container given MIG devices through CDI has the
     * access nodes of their GPU and compute instances under /dev/nvidia-caps and not the
     * monitor capability (nvidia-cap2), which lets a process see every MIG device (the lab
     * node itself, and a container with NVIDIA_MIG_MONITOR_DEVICES=all). */
    int caps = by_nodes && device_node_exists(st, "nvidia-caps")
               && !device_node_exists(st, "nvidia-caps/nvidia-cap2");

    st->nmig_tokens = 0;
    for (unsigned int i = 0; i < st->ngpus; i++) {
        char name[32];
        snprintf(name, sizeof name, "nvidia%u", st->gpus[i].minor_number);
        st->gpus[i].visible = by_nodes ? device_node_exists(st, name) : all;
        st->gpus[i].mig_only = 0;
        st->gpus[i].mig_caps = caps;
    }
    if (!all && strcmp(env, "none") && strcmp(env, "void") && strlen(env) < sizeof list) {
        memcpy(list, env, strlen(env) + 1);
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            unsigned int index;
            tok = trim(tok);
            if (parse_uint(tok, &index) == 0) {
                if (index < st->ngpus)
                    st->gpus[index].visible = 1;
                continue;
            }
            if (!strncasecmp(tok, "MIG-", 4)) {
                struct sim_gpu *parent = mig_parent(st, tok);
                if (parent && st->nmig_tokens < sizeof st->mig_tokens / sizeof *st->mig_tokens
                    && strlen(tok) < sizeof *st->mig_tokens) {
                    strcpy(st->mig_tokens[st->nmig_tokens++], tok);
                    parent->mig_only = 1; /* unless the GPU is named itself: below */
                }
                continue;
            }
            for (unsigned int i = 0; i < st->ngpus; i++)
                if (!strcasecmp(tok, st->gpus[i].uuid))
                    st->gpus[i].visible = 1;
        }
        for (unsigned int i = 0; i < st->ngpus; i++) {
            if (st->gpus[i].visible)
                st->gpus[i].mig_only = 0;
            else if (st->gpus[i].mig_only)
                st->gpus[i].visible = 1;
        }
    }
    st->nvisible = 0;
    for (unsigned int i = 0; i < st->ngpus; i++) {
        if (st->gpus[i].visible) {
            st->gpus[i].visible_index = st->nvisible;
            st->visible[st->nvisible++] = &S.gpus[i]; /* handles point into the live state */
        }
    }
}

/* ---- MIG state: what the driver keeps across processes ------------------------------- *
 * $GPUPROV_SIM_STATE_DIR/mig-state (default /var/lib/gpuprov-sim/mig, a writable mount of
 * the node's lab directory: simhw.MIG_STATE_NODE_PATH), one line per fact:
 *   mode <gpu-uuid> <current> <pending>
 *   gi <gpu-uuid> <gi-id> <profile-id> <start>
 *   ci <gpu-uuid> <gi-id> <ci-id> <ci-profile> <start>
 * Written whole (temporary file, rename) under an flock by each call that changes it, after
 * reading it again, so that processes (the MIG stage, verify, nvidia-smi) see one another's
 * changes. */
static const char *mig_state_dir(void)
{
    const char *dir = getenv("GPUPROV_SIM_STATE_DIR");
    return dir && *dir ? dir : "/var/lib/gpuprov-sim/mig";
}

static struct sim_gpu *gpu_by_uuid(struct sim_state *st, const char *uuid)
{
    for (unsigned int i = 0; i < st->ngpus; i++)
        if (!strcmp(st->gpus[i].uuid, uuid))
            return &st->gpus[i];
    return NULL;
}

/* A profile of the GPU by its ID (what NVML's create and list calls take), or by its
 * NVML_GPU_INSTANCE_PROFILE_* index (what the info calls take). */
static const struct sim_mig_profile *mig_profile(const struct sim_gpu *g, int by_index,
                                                 unsigned int value)
{
    for (unsigned int i = 0; i < g->nmig_profiles; i++)
        if ((by_index ? g->mig_profiles[i].index : g->mig_profiles[i].id) == value)
            return &g->mig_profiles[i];
    return NULL;
}

#define mig_profile_by_id(g, id) mig_profile((g), 0, (id))
#define profile_by_index(g, index) mig_profile((g), 1, (index))

static void read_mig_state(struct sim_state *st)
{
    char path[PATH_MAX], line[LINE_MAX_LEN + 2];
    FILE *f;

    for (unsigned int i = 0; i < st->ngpus; i++) {
        struct sim_gpu *g = &st->gpus[i];
        memset(g->gis, 0, sizeof g->gis);
        g->mig_current = g->mig_pending = g->mig_boot_mode;
    }
    if (snprintf(path, sizeof path, "%s/mig-state", mig_state_dir()) >= (int)sizeof path)
        return;
    f = fopen(path, "r");
    if (!f)
        return; /* nothing changed since the node came up */
    while (fgets(line, sizeof line, f)) {
        char kind[8], uuid[96], extra;
        unsigned int a, b, c, d;
        struct sim_gpu *g;
        int n = sscanf(line, "%7s %95s %u %u %u %u %c", kind, uuid, &a, &b, &c, &d, &extra);
        g = n >= 4 ? gpu_by_uuid(st, uuid) : NULL;
        if (!g || !g->nmig_profiles)
            continue; /* another node's GPU, or one no longer configured */
        if (!strcmp(kind, "mode") && n == 4) {
            g->mig_current = a;
            g->mig_pending = b;
        } else if (!strcmp(kind, "gi") && n == 5 && a >= 1 && a <= MAX_GI &&
                   mig_profile_by_id(g, b)) {
            g->gis[a].used = 1;
            g->gis[a].profile = mig_profile_by_id(g, b);
            g->gis[a].start = c;
        } else if (!strcmp(kind, "ci") && n == 6 && a >= 1 && a <= MAX_GI && g->gis[a].used &&
                   b < MAX_CI) {
            g->gis[a].cis[b].used = 1;
            g->gis[a].cis[b].profile = c;
            g->gis[a].cis[b].start = d;
        } else {
            complain("%s: ignoring malformed line: %s", path, trim(line));
        }
    }
    fclose(f);
    for (unsigned int i = 0; i < st->ngpus; i++) /* a CI's size follows from its profile */
        for (unsigned int gi = 1; gi <= MAX_GI; gi++)
            for (unsigned int ci = 0; ci < MAX_CI; ci++) {
                struct sim_ci *x = &st->gpus[i].gis[gi].cis[ci];
                static const unsigned int slices[] = {1, 2, 3, 4, 7, 8, 6, 1, 7};
                x->slices = x->profile < sizeof slices / sizeof *slices ? slices[x->profile] : 1;
            }
}

static nvmlReturn_t write_mig_state(const struct sim_state *st)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    FILE *f;

    if (snprintf(path, sizeof path, "%s/mig-state", mig_state_dir()) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return NVML_ERROR_UNKNOWN;
    f = fopen(tmp, "w");
    if (!f) {
        complain("cannot write %s: %s", tmp, strerror(errno));
        return errno == EACCES || errno == EROFS ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
    }
    for (unsigned int i = 0; i < st->ngpus; i++) {
        const struct sim_gpu *g = &st->gpus[i];
        if (!g->nmig_profiles)
            continue;
        fprintf(f, "mode %s %u %u\n", g->uuid, g->mig_current, g->mig_pending);
        for (unsigned int gi = 1; gi <= MAX_GI; gi++) {
            if (!g->gis[gi].used)
                continue;
            fprintf(f, "gi %s %u %u %u\n", g->uuid, gi, g->gis[gi].profile->id,
                    g->gis[gi].start);
            for (unsigned int ci = 0; ci < MAX_CI; ci++)
                if (g->gis[gi].cis[ci].used)
                    fprintf(f, "ci %s %u %u %u %u\n", g->uuid, gi, ci,
                            g->gis[gi].cis[ci].profile, g->gis[gi].cis[ci].start);
        }
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        complain("cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t load_state(struct sim_state *st)
{
    const char *dir = getenv("GPUPROV_SIM_DIR");
    nvmlReturn_t rc;

    memset(st, 0, sizeof *st);
    strcpy(st->node_root, "/");
    strcpy(st->persistence_mode, "auto");
    if (!dir || !*dir)
        dir = "/etc/gpuprov-sim";
    rc = read_config(st, dir);
    if (rc != NVML_SUCCESS)
        return rc;
    read_faults(st, dir);
    if (st->fault_init_fail)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (st->fault_version_mismatch)
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    {
        /* GPUPROV_SIM_DRIVER_ROOT: the emulated kubelet reads a node's NVML from the host,
         * where the driver installed in the node is under its container's root. */
        const char *driver_root = getenv("GPUPROV_SIM_DRIVER_ROOT");
        char installed[80];
        if (installed_driver_version(driver_root && *driver_root ? driver_root : st->node_root,
                                     installed, sizeof installed) == 0)
            memcpy(st->driver_version, installed, sizeof installed);
    }
    if (!st->driver_version[0]) {
        complain("no driver_version in nvml.conf and no NVIDIA driver installed");
        return NVML_ERROR_UNKNOWN;
    }
    st->cuda_driver_version = cuda_version_for(st, st->driver_version);
    st->persistence = persistence_enabled(st);
    for (unsigned int i = 0; i < st->ngpus; i++) {
        struct sim_gpu *g = &st->gpus[i];
        if (g->hot)
            g->temperature = g->temp_slowdown + HOT_ABOVE_SLOWDOWN;
    }
    apply_visible_devices(st);
    return NVML_SUCCESS;
}

/* ---- API ------------------------------------------------------------------------------ */
#define API __attribute__((visibility("default")))

static int valid_device(nvmlDevice_t d)
{
    uintptr_t p = (uintptr_t)d, lo = (uintptr_t)S.gpus, hi = (uintptr_t)(S.gpus + S.ngpus);
    if (p < lo || p >= hi || (p - lo) % sizeof(struct sim_gpu))
        return 0;
    return d->visible && !d->lost;
}

#define REQUIRE_INIT()                        \
    do {                                      \
        if (refcount == 0)                    \
            return NVML_ERROR_UNINITIALIZED;  \
    } while (0)

#define REQUIRE_DEVICE(d, out)                   \
    do {                                         \
        REQUIRE_INIT();                          \
        if (!valid_device(d) || !(out))          \
            return NVML_ERROR_INVALID_ARGUMENT;  \
    } while (0)

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src)
{
    size_t n = strlen(src);
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (n + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    static struct sim_state fresh; /* parsed outside S so a failed re-init keeps the old state */
    nvmlReturn_t rc;
    (void)flags;
    pthread_mutex_lock(&lock);
    rc = load_state(&fresh);
    if (rc == NVML_SUCCESS) {
        S = fresh;
        read_mig_state(&S); /* its instances' profiles point into S, not the parse buffer */
        refcount++;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        refcount--;
    pthread_mutex_unlock(&lock);
    return rc;
}

API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 23: return "Insufficient resources";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    REQUIRE_INIT();
    return copy_out(version, length, S.driver_version);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char buf[96];
    REQUIRE_INIT();
    /* NVML's version is the CUDA major version followed by the driver version. */
    snprintf(buf, sizeof buf, "%d.%s", S.cuda_driver_version / 1000, S.driver_version);
    return copy_out(version, length, buf);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    REQUIRE_INIT();
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = S.cuda_driver_version;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    REQUIRE_INIT();
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = S.nvisible; /* a lost GPU still counts: the driver still knows it */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

static nvmlReturn_t hand_out(struct sim_gpu *g, nvmlDevice_t *device)
{
    if (g->lost)
        return NVML_ERROR_GPU_IS_LOST;
    *device = g;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (!device || index >= S.nvisible)
        return NVML_ERROR_INVALID_ARGUMENT;
    return hand_out(S.visible[index], device);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < S.nvisible; i++)
        if (!strcmp(uuid, S.visible[i]->uuid))
            return hand_out(S.visible[i], device);
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned int domain, bus, dev, fn;
    char extra;
    REQUIRE_INIT();
    if (!pciBusId || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* accepts "domain:bus:device.function" with a 4- or 8-digit domain, and "bus:device.fn" */
    if (sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &extra) != 4) {
        domain = 0;
        if (sscanf(pciBusId, "%x:%x.%x%c", &bus, &dev, &fn, &extra) != 3)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned int i = 0; i < S.nvisible; i++) {
        struct sim_gpu *g = S.visible[i];
        if (g->domain == domain && g->bus == bus && g->device == dev && fn == 0)
            return hand_out(g, device);
    }
    return NVML_ERROR_NOT_FOUND;
}

/* MIG device handles (below): the getters that answer for them too. */
static struct sim_ci *mig_device(nvmlDevice_t d, struct sim_gi **gi, struct sim_gpu **gpu);
static void mig_uuid(const struct sim_gpu *g, unsigned int gi, unsigned int ci, char *out,
                     size_t size);

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct sim_gpu *g = NULL;
    struct sim_gi *gi = NULL;
    REQUIRE_INIT();
    if (name && mig_device(device, &gi, &g)) { /* "NVIDIA H100 80GB HBM3 MIG 1g.10gb" */
        char buf[160];
        snprintf(buf, sizeof buf, "%s MIG %s", g->name, gi->profile->name);
        return copy_out(name, length, buf);
    }
    REQUIRE_DEVICE(device, name);
    return copy_out(name, length, device->name);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct sim_gpu *g = NULL;
    struct sim_gi *gi = NULL;
    struct sim_ci *ci;
    REQUIRE_INIT();
    if (uuid && (ci = mig_device(device, &gi, &g))) {
        char buf[96];
        mig_uuid(g, (unsigned int)(gi - g->gis), (unsigned int)(ci - gi->cis), buf, sizeof buf);
        return copy_out(uuid, length, buf);
    }
    REQUIRE_DEVICE(device, uuid);
    return copy_out(uuid, length, device->uuid);
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    REQUIRE_DEVICE(device, serial);
    if (!device->serial[0])
        return NVML_ERROR_NOT_SUPPORTED;
    return copy_out(serial, length, device->serial);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    REQUIRE_DEVICE(device, pci);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0",
             device->domain & 0xFFFF, device->bus & 0xFF, device->device & 0x1F);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", device->domain,
             device->bus & 0xFF, device->device & 0x1F);
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->device;
    pci->pciDeviceId = device->pci_device_id;
    pci->pciSubSystemId = device->pci_subsystem_id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct sim_gi *gi = NULL;
    REQUIRE_INIT();
    if (memory && mig_device(device, &gi, NULL)) { /* the GPU instance's memory, unused */
        memory->total = gi->profile->memory_mb << 20;
        memory->used = 0;
        memory->free = memory->total;
        return NVML_SUCCESS;
    }
    REQUIRE_DEVICE(device, memory);
    /* v1 counts the driver's reservation as used (a real H200 on 580.159.04: 615 MiB used
     * when idle, reserved 615 MiB and used 0 through v2; tests/fixtures/real/) */
    memory->total = device->memory_total;
    memory->used = device->memory_used + device->memory_reserved;
    memory->free = device->memory_total - memory->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    struct sim_gi *gi = NULL;
    REQUIRE_INIT();
    if (memory && memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (memory && mig_device(device, &gi, NULL)) {
        memory->total = gi->profile->memory_mb << 20;
        memory->reserved = 0;
        memory->used = 0;
        memory->free = memory->total;
        return NVML_SUCCESS;
    }
    REQUIRE_DEVICE(device, memory);
    memory->total = device->memory_total;
    memory->reserved = device->memory_reserved;
    memory->used = device->memory_used;
    memory->free = device->memory_total - device->memory_reserved - device->memory_used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    REQUIRE_DEVICE(device, major);
    if (!minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    REQUIRE_DEVICE(device, arch);
    *arch = device->architecture;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *type)
{
    REQUIRE_DEVICE(device, type);
    *type = device->brand;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType,
                                          unsigned int *temp)
{
    REQUIRE_DEVICE(device, temp);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = device->temperature;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temperature)
{
    unsigned int t;
    nvmlReturn_t rc;
    REQUIRE_DEVICE(device, temperature);
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    rc = nvmlDeviceGetTemperature(device, temperature->sensorType, &t);
    if (rc == NVML_SUCCESS)
        temperature->temperature = (int)t;
    return rc;
}

API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                                   unsigned int thresholdType,
                                                   unsigned int *temp)
{
    REQUIRE_DEVICE(device, temp);
    switch (thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
        *temp = device->temp_shutdown;
        return NVML_SUCCESS;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
        *temp = device->temp_slowdown;
        return NVML_SUCCESS;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX:
        if (!device->has_temp_gpu_max)
            return NVML_ERROR_NOT_SUPPORTED;
        *temp = device->temp_gpu_max;
        return NVML_SUCCESS;
    default:
        return NVML_ERROR_NOT_SUPPORTED;
    }
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    REQUIRE_DEVICE(device, utilization);
    utilization->gpu = device->utilization_gpu;
    utilization->memory = device->utilization_memory;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    REQUIRE_DEVICE(device, power);
    *power = device->power_usage_mw;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    REQUIRE_DEVICE(device, limit);
    *limit = device->power_limit_mw;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

API nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit)
{
    return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode)
{
    REQUIRE_DEVICE(device, mode);
    *mode = (unsigned int)S.persistence;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current,
                                      unsigned int *pending)
{
    REQUIRE_DEVICE(device, current);
    if (!pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->ecc)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = 1;
    return NVML_SUCCESS;
}

static unsigned long long ecc_count(const struct sim_gpu *g, unsigned int errorType)
{
    return errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED && g->ecc_uncorrectable ? 1 : 0;
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType,
                                             unsigned int counterType,
                                             unsigned long long *eccCounts)
{
    REQUIRE_DEVICE(device, eccCounts);
    if (errorType >= NVML_MEMORY_ERROR_TYPE_COUNT || counterType >= NVML_ECC_COUNTER_TYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->ecc)
        return NVML_ERROR_NOT_SUPPORTED;
    *eccCounts = ecc_count(device, errorType); /* volatile and aggregate alike */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, unsigned int errorType,
                                                 unsigned int counterType,
                                                 unsigned int locationType,
                                                 unsigned long long *count)
{
    REQUIRE_DEVICE(device, count);
    if (errorType >= NVML_MEMORY_ERROR_TYPE_COUNT ||
        counterType >= NVML_ECC_COUNTER_TYPE_COUNT || locationType >= NVML_MEMORY_LOCATION_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->ecc)
        return NVML_ERROR_NOT_SUPPORTED;
    *count = locationType == NVML_MEMORY_LOCATION_DEVICE_MEMORY ? ecc_count(device, errorType) : 0;
    return NVML_SUCCESS;
}

/* Pre-Ampere memory repair: with row-remap-pending one double-bit-error page is retired,
 * pending until the next reset. */
static nvmlReturn_t retired_pages(nvmlDevice_t device, unsigned int cause,
                                  unsigned int *pageCount, unsigned long long *addresses,
                                  unsigned long long *timestamps)
{
    unsigned int n;
    REQUIRE_DEVICE(device, pageCount);
    if (cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->ecc || device->row_remapping)
        return NVML_ERROR_NOT_SUPPORTED;
    n = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR && device->remap_pending ? 1 : 0;
    if (*pageCount < n || (n && !addresses)) {
        *pageCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *pageCount = n;
    if (n) {
        addresses[0] = RETIRED_PAGE_ADDRESS;
        if (timestamps)
            timestamps[0] = RETIRED_PAGE_TIMESTAMP;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, unsigned int cause,
                                           unsigned int *pageCount,
                                           unsigned long long *addresses)
{
    return retired_pages(device, cause, pageCount, addresses, NULL);
}

API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, unsigned int cause,
                                              unsigned int *pageCount,
                                              unsigned long long *addresses,
                                              unsigned long long *timestamps)
{
    unsigned int want = pageCount ? *pageCount : 0;
    if (want && !timestamps)
        return NVML_ERROR_INVALID_ARGUMENT;
    return retired_pages(device, cause, pageCount, addresses, timestamps);
}

API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending)
{
    REQUIRE_DEVICE(device, isPending);
    if (!device->ecc || device->row_remapping)
        return NVML_ERROR_NOT_SUPPORTED;
    *isPending = device->remap_pending ? 1 : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                           unsigned int *uncRows, unsigned int *isPending,
                                           unsigned int *failureOccurred)
{
    REQUIRE_DEVICE(device, corrRows);
    if (!uncRows || !isPending || !failureOccurred)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->row_remapping)
        return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = 0;
    *uncRows = device->remap_pending ? 1 : 0;
    *isPending = device->remap_pending ? 1 : 0;
    *failureOccurred = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                        unsigned long long *reasons)
{
    REQUIRE_DEVICE(device, reasons);
    if (device->hot)
        *reasons = REASON_HW_SLOWDOWN | REASON_SW_THERMAL | REASON_HW_THERMAL;
    else
        *reasons = device->nprocs == 0 && device->utilization_gpu == 0 ? REASON_GPU_IDLE : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

API nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device,
                                                          unsigned long long *reasons)
{
    REQUIRE_DEVICE(device, reasons);
    *reasons = REASONS_SUPPORTED;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device,
                                                             unsigned long long *reasons)
{
    return nvmlDeviceGetSupportedClocksEventReasons(device, reasons);
}

#define UINT_GETTER(fn, field)                                          \
    API nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out)         \
    {                                                                   \
        REQUIRE_DEVICE(device, out);                                    \
        *out = device->field;                                           \
        return NVML_SUCCESS;                                            \
    }

UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_curr_gen)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
UINT_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_max_gen)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_curr_width)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)
UINT_GETTER(nvmlDeviceGetMinorNumber, minor_number)
UINT_GETTER(nvmlDeviceGetIndex, visible_index)

static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount,
                                      nvmlProcessInfo_t *infos)
{
    REQUIRE_DEVICE(device, infoCount);
    if (*infoCount < device->nprocs || (device->nprocs && !infos)) {
        *infoCount = device->nprocs;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *infoCount = device->nprocs;
    for (unsigned int i = 0; i < device->nprocs; i++) {
        infos[i].pid = device->procs[i].pid;
        infos[i].usedGpuMemory = device->procs[i].used;
        infos[i].gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT; /* no MIG */
        infos[i].computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos);
}

/* ---- MIG ------------------------------------------------------------------------------ *
 * Followed: NVML's API reference (nvml.h, "Multi Instance GPU Management"), NVIDIA's MIG user
 * guide (profiles, placements, "GPU Reset" and mode changes). Simplified, and said so in
 * gpuprov/lab/SIMULATION.md: GPU instance ids are the lowest free id (the driver numbers them
 * by placement); a GPU whose processes still run keeps a mode change pending until the lab
 * resets it, an idle one changes at once (the driver resets it itself, as on bare metal). */
typedef struct sim_gi *nvmlGpuInstance_t;
typedef struct sim_ci *nvmlComputeInstance_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t, nvmlComputeInstancePlacement_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
#define nvmlGpuInstanceProfileInfo_v2 NVML_STRUCT_VERSION(sizeof(nvmlGpuInstanceProfileInfo_v2_t), 2)

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount;
    unsigned int sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount;
    unsigned int sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id, sliceCount, instanceCount, multiprocessorCount;
    unsigned int sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount;
    unsigned int sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;
#define nvmlComputeInstanceProfileInfo_v2 NVML_STRUCT_VERSION(sizeof(nvmlComputeInstanceProfileInfo_v2_t), 2)

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount;
    unsigned int sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    unsigned int gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

#define CI_PROFILES 5 /* 1, 2, 3, 4 and 7 slices: NVML_COMPUTE_INSTANCE_PROFILE_1..7_SLICE */
static const unsigned int ci_slices[CI_PROFILES] = {1, 2, 3, 4, 7};
/* Media engines of a whole GPU (copy engines, NVDEC, NVENC, NVJPG, OFA; H100 SXM: 7 NVDEC,
 * 7 NVJPG, 1 OFA, no NVENC). A GI gets its share by compute slices; "+me" the whole set. */
#define GPU_COPY_ENGINES 7
#define GPU_DECODERS 7
#define GPU_JPEGS 7

/* Locate a GI or CI handle in the live state: NULL where it is none (or destroyed). */
static struct sim_gpu *gpu_of_gi(nvmlGpuInstance_t gi)
{
    for (unsigned int i = 0; i < S.ngpus; i++) {
        struct sim_gpu *g = &S.gpus[i];
        for (unsigned int id = 1; id <= MAX_GI; id++)
            if (gi == &g->gis[id])
                return g->visible && gi->used ? g : NULL;
    }
    return NULL;
}

static struct sim_gi *gi_of_ci(nvmlComputeInstance_t ci, struct sim_gpu **gpu)
{
    for (unsigned int i = 0; i < S.ngpus; i++) {
        struct sim_gpu *g = &S.gpus[i];
        for (unsigned int id = 1; id <= MAX_GI; id++)
            for (unsigned int c = 0; c < MAX_CI; c++)
                if (ci == &g->gis[id].cis[c]) {
                    if (!g->visible || !g->gis[id].used || !ci->used)
                        return NULL;
                    if (gpu)
                        *gpu = g;
                    return &g->gis[id];
                }
    }
    return NULL;
}

static unsigned int gi_id(const struct sim_gpu *g, const struct sim_gi *gi)
{
    return (unsigned int)(gi - g->gis);
}

static unsigned int ci_id(const struct sim_gi *gi, const struct sim_ci *ci)
{
    return (unsigned int)(ci - gi->cis);
}

/* A MIG device handle (a CI), or NULL for a GPU's own handle or anything else. */
static struct sim_ci *mig_device(nvmlDevice_t d, struct sim_gi **gi, struct sim_gpu **gpu)
{
    struct sim_ci *ci = (struct sim_ci *)d;
    struct sim_gi *owner = gi_of_ci(ci, gpu);
    if (!owner)
        return NULL;
    if (gi)
        *gi = owner;
    return ci;
}

static void mig_uuid(const struct sim_gpu *g, unsigned int gi, unsigned int ci, char *out,
                     size_t size)
{
    /* Stable for the instance's life and distinct per GPU, GI and CI (FNV-1a of them). */
    unsigned long long h = 1469598103934665603ULL;
    char key[128];
    snprintf(key, sizeof key, "%s/%u/%u", g->uuid, gi, ci);
    for (const char *c = key; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    snprintf(out, size, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", h >> 32, (h >> 16) & 0xffff,
             h & 0xffff, (h >> 48) ^ 0x4000, (h * 2654435761ULL) & 0xffffffffffffULL);
}

static unsigned int memory_mask(unsigned int start, unsigned int size)
{
    return ((1u << size) - 1) << start;
}

static void gi_usage(const struct sim_gpu *g, unsigned int *memory, unsigned int *compute,
                     unsigned int *media)
{
    *memory = *compute = *media = 0;
    for (unsigned int id = 1; id <= MAX_GI; id++) {
        const struct sim_gi *gi = &g->gis[id];
        if (!gi->used)
            continue;
        *memory |= memory_mask(gi->start, gi->profile->size);
        *compute += gi->profile->compute;
        *media += strstr(gi->profile->name, "+me") != NULL;
    }
}

/* Where the profile fits now: the highest allowed start that is free, as the driver places
 * an instance created without a placement (`nvidia-smi mig -lgi` after `-cgi 9,14,19,19`
 * shows the 3g instance at 4:4); -1: none. */
static int free_start(const struct sim_gpu *g, const struct sim_mig_profile *p, int wanted)
{
    unsigned int memory, compute, media, count = 0;
    gi_usage(g, &memory, &compute, &media);
    for (unsigned int id = 1; id <= MAX_GI; id++)
        count += g->gis[id].used && g->gis[id].profile->id == p->id;
    if (count >= p->count || compute + p->compute > g->compute_slices ||
        (strstr(p->name, "+me") && media))
        return -1;
    for (int start = MIG_MEMORY_SLICES - 1; start >= 0; start--) {
        if (!(p->starts_mask & (1u << start)) || (wanted >= 0 && start != wanted))
            continue;
        if (!(memory & memory_mask((unsigned int)start, p->size)))
            return start;
    }
    return -1;
}

static nvmlReturn_t require_mig(nvmlDevice_t device)
{
    REQUIRE_INIT();
    if (!valid_device(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    return device->nmig_profiles ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* NVML's checks of a call about one profile of a MIG-capable GPU, then the profile. */
static nvmlReturn_t profile_call(nvmlDevice_t device, const void *out, int by_index,
                                 unsigned int value, const struct sim_mig_profile **p)
{
    nvmlReturn_t rc = require_mig(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    *p = mig_profile(device, by_index, value);
    return *p ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* Changes: under this process's lock and the state file's flock, from the state as it is
 * now on disk. -1: the state cannot be locked (nothing held then). */
static int mig_lock(void)
{
    char path[PATH_MAX];
    int fd;
    pthread_mutex_lock(&lock);
    snprintf(path, sizeof path, "%s/mig-state.lock", mig_state_dir());
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && flock(fd, LOCK_EX) != 0) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        pthread_mutex_unlock(&lock);
        return -1;
    }
    read_mig_state(&S);
    return fd;
}

/* Releases both locks, writing the state first where the call changed it; the call's
 * result, or the write's failure. */
static nvmlReturn_t mig_unlock(int fd, int changed, nvmlReturn_t rc)
{
    if (changed) {
        nvmlReturn_t written = write_mig_state(&S);
        rc = written != NVML_SUCCESS ? written : rc;
    }
    close(fd);
    pthread_mutex_unlock(&lock);
    return rc;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                      unsigned int *pendingMode)
{
    nvmlReturn_t rc = require_mig(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = device->mig_current;
    *pendingMode = device->mig_pending;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                      nvmlReturn_t *activationStatus)
{
    nvmlReturn_t rc = require_mig(device);
    int fd;
    if (rc != NVML_SUCCESS)
        return rc;
    if (mode > 1 || !activationStatus)
        return NVML_ERROR_INVALID_ARGUMENT;
    fd = mig_lock();
    if (fd < 0)
        return NVML_ERROR_NO_PERMISSION;
    for (unsigned int id = 1; id <= MAX_GI; id++)
        if (device->gis[id].used) /* instances must go first */
            return mig_unlock(fd, 0, NVML_ERROR_IN_USE);
    device->mig_pending = mode;
    if (device->nprocs) {
        *activationStatus = NVML_ERROR_RESET_REQUIRED; /* in use: pending until a reset */
    } else {
        device->mig_current = mode;
        *activationStatus = NVML_SUCCESS;
    }
    return mig_unlock(fd, 1, NVML_SUCCESS);
}

static void fill_gi_profile(const struct sim_gpu *g, const struct sim_mig_profile *p,
                            nvmlGpuInstanceProfileInfo_t *info)
{
    int me = strstr(p->name, "+me") != NULL;
    memset(info, 0, sizeof *info);
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->compute;
    info->instanceCount = p->count;
    info->multiprocessorCount = p->sm;
    info->copyEngineCount = p->compute * GPU_COPY_ENGINES / g->compute_slices;
    info->decoderCount = me ? GPU_DECODERS : p->compute * GPU_DECODERS / g->compute_slices;
    info->jpegCount = me ? GPU_JPEGS : p->compute * GPU_JPEGS / g->compute_slices;
    info->ofaCount = me || p->compute == g->compute_slices;
    info->memorySizeMB = p->memory_mb;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                     nvmlGpuInstanceProfileInfo_t *info)
{
    const struct sim_mig_profile *p;
    nvmlReturn_t rc = profile_call(device, info, 1, profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    fill_gi_profile(device, p, info);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                      nvmlGpuInstanceProfileInfo_v2_t *info)
{
    nvmlGpuInstanceProfileInfo_t v1;
    nvmlReturn_t rc;
    if (info && info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    rc = nvmlDeviceGetGpuInstanceProfileInfo(device, profile, info ? &v1 : NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    /* Field by field: v2's 64-bit memory size sits after padding that v1 does not have. */
    info->id = v1.id;
    info->isP2pSupported = v1.isP2pSupported;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->copyEngineCount = v1.copyEngineCount;
    info->decoderCount = v1.decoderCount;
    info->encoderCount = v1.encoderCount;
    info->jpegCount = v1.jpegCount;
    info->ofaCount = v1.ofaCount;
    info->memorySizeMB = v1.memorySizeMB;
    snprintf(info->name, sizeof info->name, "MIG %s", profile_by_index(device, profile)->name);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count)
{
    const struct sim_mig_profile *p;
    unsigned int n = 0;
    nvmlReturn_t rc = profile_call(device, count, 0, profileId, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    for (unsigned int start = 0; start < MIG_MEMORY_SLICES; start++)
        n += (p->starts_mask >> start) & 1;
    if (!placements) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    n = 0;
    for (unsigned int start = 0; start < MIG_MEMORY_SLICES; start++)
        if (p->starts_mask & (1u << start)) {
            placements[n].start = start;
            placements[n++].size = p->size;
        }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                           unsigned int profileId,
                                                           unsigned int *count)
{
    const struct sim_mig_profile *p;
    struct sim_gpu trial;
    nvmlReturn_t rc = profile_call(device, count, 0, profileId, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (device->mig_current != 1)
        return NVML_ERROR_NOT_SUPPORTED;
    /* Place it again and again on a copy: aligned placements make this greedy count the
     * maximum. */
    trial = *device;
    *count = 0;
    for (int start; (start = free_start(&trial, p - device->mig_profiles + trial.mig_profiles,
                                        -1)) >= 0;) {
        unsigned int id = 1;
        while (id <= MAX_GI && trial.gis[id].used)
            id++;
        if (id > MAX_GI)
            break;
        trial.gis[id].used = 1;
        trial.gis[id].profile = p - device->mig_profiles + trial.mig_profiles;
        trial.gis[id].start = (unsigned int)start;
        (*count)++;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned int profileId, int wanted,
                              nvmlGpuInstance_t *out)
{
    nvmlReturn_t rc = require_mig(device);
    const struct sim_mig_profile *p;
    unsigned int id = 1;
    int fd, start;
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    p = mig_profile_by_id(device, profileId);
    if (!p || device->mig_current != 1)
        return NVML_ERROR_NOT_SUPPORTED; /* no such profile, or MIG mode is off */
    if (wanted >= 0 && !(p->starts_mask & (1u << wanted)))
        return NVML_ERROR_INVALID_ARGUMENT;
    fd = mig_lock();
    if (fd < 0)
        return NVML_ERROR_NO_PERMISSION;
    while (id <= MAX_GI && device->gis[id].used)
        id++;
    start = id <= MAX_GI ? free_start(device, p, wanted) : -1;
    if (start < 0)
        return mig_unlock(fd, 0, NVML_ERROR_INSUFFICIENT_RESOURCES);
    memset(&device->gis[id], 0, sizeof device->gis[id]);
    device->gis[id].used = 1;
    device->gis[id].profile = p;
    device->gis[id].start = (unsigned int)start;
    *out = &device->gis[id];
    return mig_unlock(fd, 1, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                             nvmlGpuInstance_t *gpuInstance)
{
    return create_gi(device, profileId, -1, gpuInstance);
}

API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gpuInstance)
{
    if (!placement)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(device, profileId, (int)placement->start, gpuInstance);
}

API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    int fd;
    REQUIRE_INIT();
    fd = mig_lock(); /* re-reads: the instance may be gone already */
    if (fd < 0)
        return NVML_ERROR_NO_PERMISSION;
    if (!gpu_of_gi(gpuInstance))
        return mig_unlock(fd, 0, NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int c = 0; c < MAX_CI; c++)
        if (gpuInstance->cis[c].used) /* its compute instances must go first */
            return mig_unlock(fd, 0, NVML_ERROR_IN_USE);
    memset(gpuInstance, 0, sizeof *gpuInstance);
    return mig_unlock(fd, 1, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                           nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    const struct sim_mig_profile *p;
    nvmlReturn_t rc = profile_call(device, gpuInstances && count ? count : NULL, 0, profileId,
                                   &p);
    if (rc != NVML_SUCCESS)
        return rc;
    *count = 0;
    for (unsigned int id = 1; id <= MAX_GI; id++)
        if (device->gis[id].used && device->gis[id].profile->id == p->id)
            gpuInstances[(*count)++] = &device->gis[id];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                              nvmlGpuInstance_t *gpuInstance)
{
    nvmlReturn_t rc = require_mig(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!gpuInstance || id < 1 || id > MAX_GI)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->gis[id].used)
        return NVML_ERROR_NOT_FOUND;
    *gpuInstance = &device->gis[id];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    struct sim_gpu *g;
    REQUIRE_INIT();
    g = gpu_of_gi(gpuInstance);
    if (!g || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device = g;
    info->id = gi_id(g, gpuInstance);
    info->profileId = gpuInstance->profile->id;
    info->placement.start = gpuInstance->start;
    info->placement.size = gpuInstance->profile->size;
    return NVML_SUCCESS;
}

/* Compute instance profiles of a GI: 1, 2, 3, 4 or 7 compute slices, at most its own. */
static int ci_profile_of(const struct sim_gi *gi, unsigned int profile)
{
    if (profile >= CI_PROFILES || ci_slices[profile] > gi->profile->compute)
        return -1;
    if (ci_slices[profile] == 3 && gi->profile->compute == 4)
        return -1; /* a 4g instance has no 3-slice compute profile */
    return (int)profile;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info)
{
    struct sim_gpu *g;
    unsigned int slices;
    REQUIRE_INIT();
    g = gpu_of_gi(gpuInstance);
    if (!g || !info || engProfile != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (ci_profile_of(gpuInstance, profile) < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    slices = ci_slices[profile];
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = gpuInstance->profile->compute / slices;
    info->multiprocessorCount = gpuInstance->profile->sm * slices / gpuInstance->profile->compute;
    {
        nvmlGpuInstanceProfileInfo_t gi;
        fill_gi_profile(g, gpuInstance->profile, &gi);
        info->sharedCopyEngineCount = gi.copyEngineCount;
        info->sharedDecoderCount = gi.decoderCount;
        info->sharedEncoderCount = gi.encoderCount;
        info->sharedJpegCount = gi.jpegCount;
        info->sharedOfaCount = gi.ofaCount;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_v2_t *info)
{
    nvmlComputeInstanceProfileInfo_t v1;
    nvmlReturn_t rc;
    if (info && info->version != nvmlComputeInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    rc = nvmlGpuInstanceGetComputeInstanceProfileInfo(gpuInstance, profile, engProfile,
                                                      info ? &v1 : NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    memcpy(&info->id, &v1, sizeof v1);
    if (ci_slices[profile] == gpuInstance->profile->compute)
        snprintf(info->name, sizeof info->name, "MIG %s", gpuInstance->profile->name);
    else
        snprintf(info->name, sizeof info->name, "MIG %uc.%s", ci_slices[profile],
                 gpuInstance->profile->name);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                      unsigned int profileId,
                                                      nvmlComputeInstance_t *computeInstance)
{
    unsigned int used = 0, slices, c = 0;
    int fd;
    REQUIRE_INIT();
    if (!computeInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    fd = mig_lock();
    if (fd < 0)
        return NVML_ERROR_NO_PERMISSION;
    if (!gpu_of_gi(gpuInstance))
        return mig_unlock(fd, 0, NVML_ERROR_INVALID_ARGUMENT);
    if (ci_profile_of(gpuInstance, profileId) < 0)
        return mig_unlock(fd, 0, NVML_ERROR_NOT_SUPPORTED);
    slices = ci_slices[profileId];
    for (unsigned int i = 0; i < MAX_CI; i++)
        if (gpuInstance->cis[i].used)
            used |= ((1u << gpuInstance->cis[i].slices) - 1) << gpuInstance->cis[i].start;
    while (c < MAX_CI && gpuInstance->cis[c].used)
        c++;
    for (unsigned int start = 0; c < MAX_CI && start + slices <= gpuInstance->profile->compute;
         start += slices)
        if (!(used & (((1u << slices) - 1) << start))) {
            gpuInstance->cis[c].used = 1;
            gpuInstance->cis[c].profile = profileId;
            gpuInstance->cis[c].start = start;
            gpuInstance->cis[c].slices = slices;
            *computeInstance = &gpuInstance->cis[c];
            return mig_unlock(fd, 1, NVML_SUCCESS);
        }
    return mig_unlock(fd, 0, NVML_ERROR_INSUFFICIENT_RESOURCES);
}

API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    int fd;
    REQUIRE_INIT();
    fd = mig_lock();
    if (fd < 0)
        return NVML_ERROR_NO_PERMISSION;
    if (!gi_of_ci(computeInstance, NULL))
        return mig_unlock(fd, 0, NVML_ERROR_INVALID_ARGUMENT);
    memset(computeInstance, 0, sizeof *computeInstance);
    return mig_unlock(fd, 1, NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                    unsigned int profileId,
                                                    nvmlComputeInstance_t *computeInstances,
                                                    unsigned int *count)
{
    REQUIRE_INIT();
    if (!gpu_of_gi(gpuInstance) || !computeInstances || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (ci_profile_of(gpuInstance, profileId) < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *count = 0;
    for (unsigned int c = 0; c < MAX_CI; c++)
        if (gpuInstance->cis[c].used && gpuInstance->cis[c].profile == profileId)
            computeInstances[(*count)++] = &gpuInstance->cis[c];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                               nvmlComputeInstanceInfo_t *info)
{
    struct sim_gpu *g = NULL;
    struct sim_gi *gi;
    REQUIRE_INIT();
    gi = gi_of_ci(computeInstance, &g);
    if (!gi || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device = g;
    info->gpuInstance = gi;
    info->id = ci_id(gi, computeInstance);
    info->profileId = computeInstance->profile;
    info->placement.start = computeInstance->start;
    info->placement.size = computeInstance->slices;
    return NVML_SUCCESS;
}

/* Whether this process sees the MIG device (GPUPROV_SIM_CONTAINER_GPUS: apply_visible_devices). */
/* The minor number of a MIG access capability's device node, /dev/nvidia-caps/nvidia-cap<N>, as
 * the driver lists them in /proc/driver/nvidia-caps/mig-minors (NVIDIA's MIG user guide,
 * "Device Nodes and Capabilities"): config 1, monitor 2, then per GPU (by its minor number)
 * 15 GPU instances of 9 entries each: the GI's access, then its compute instances 0..7.
 * ci < 0: the GPU instance's own. gpuprov/lab/toolkit/nvidia-ctk numbers them the same. */
static unsigned int mig_cap_minor(unsigned int gpu_minor, unsigned int gi, int ci)
{
    return 3 + gpu_minor * 15 * 9 + gi * 9 + (ci < 0 ? 0 : 1 + (unsigned int)ci);
}

static int mig_cap_exists(unsigned int minor)
{
    char name[48];
    snprintf(name, sizeof name, "nvidia-caps/nvidia-cap%u", minor);
    return device_node_exists(&S, name);
}

static int mig_visible(const struct sim_gpu *g, unsigned int gi, unsigned int ci)
{
    char buf[96];
    if (g->mig_caps)
        return mig_cap_exists(mig_cap_minor(g->minor_number, gi, -1))
               && mig_cap_exists(mig_cap_minor(g->minor_number, gi, (int)ci));
    if (!g->mig_only)
        return 1;
    mig_uuid(g, gi, ci, buf, sizeof buf);
    for (unsigned int i = 0; i < S.nmig_tokens; i++)
        if (!strcasecmp(S.mig_tokens[i], buf))
            return 1;
    return 0;
}

/* MIG devices: a GPU's compute instances, in GI then CI id order; in a container given MIG
 * devices, only those, re-indexed from 0 (the maximum stays the GPU's, as nvml.h defines it). */
API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    REQUIRE_DEVICE(device, count);
    /* Zero where MIG is not supported or not enabled (nvml.h). */
    *count = device->nmig_profiles && device->mig_current == 1 ? device->compute_slices : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                     nvmlDevice_t *migDevice)
{
    unsigned int n = 0;
    REQUIRE_DEVICE(device, migDevice);
    if (!device->nmig_profiles)
        return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned int id = 1; id <= MAX_GI; id++)
        for (unsigned int c = 0; device->gis[id].used && c < MAX_CI; c++)
            if (device->gis[id].cis[c].used && mig_visible(device, id, c) && n++ == index) {
                *migDevice = (nvmlDevice_t)&device->gis[id].cis[c];
                return NVML_SUCCESS;
            }
    return index < device->compute_slices ? NVML_ERROR_NOT_FOUND : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    REQUIRE_INIT();
    if (!isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mig_device(device, NULL, NULL)) {
        *isMigDevice = 1;
        return NVML_SUCCESS;
    }
    if (!valid_device(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                              nvmlDevice_t *device)
{
    struct sim_gpu *g = NULL;
    REQUIRE_INIT();
    if (!device || !mig_device(migDevice, NULL, &g))
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = g;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct sim_gpu *g = NULL;
    struct sim_gi *gi = NULL;
    REQUIRE_INIT();
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_device(device, &gi, &g))
        return valid_device(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    *id = gi_id(g, gi);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct sim_gi *gi = NULL;
    struct sim_ci *ci;
    REQUIRE_INIT();
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    ci = mig_device(device, &gi, NULL);
    if (!ci)
        return valid_device(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    *id = ci_id(gi, ci);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    struct sim_gpu *g = NULL;
    struct sim_gi *gi = NULL;
    struct sim_ci *ci;
    nvmlGpuInstanceProfileInfo_t info;
    REQUIRE_INIT();
    if (!attributes)
        return NVML_ERROR_INVALID_ARGUMENT;
    ci = mig_device(device, &gi, &g);
    if (!ci)
        return valid_device(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    fill_gi_profile(g, gi->profile, &info);
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = gi->profile->sm * ci->slices / gi->profile->compute;
    attributes->sharedCopyEngineCount = info.copyEngineCount;
    attributes->sharedDecoderCount = info.decoderCount;
    attributes->sharedEncoderCount = info.encoderCount;
    attributes->sharedJpegCount = info.jpegCount;
    attributes->sharedOfaCount = info.ofaCount;
    attributes->gpuInstanceSliceCount = gi->profile->compute;
    attributes->computeInstanceSliceCount = ci->slices;
    attributes->memorySizeMB = gi->profile->memory_mb;
    return NVML_SUCCESS;
}
