// Where the OpenMP workers of a kernel's parallel region run.
//
// Linux wakes a sleeping thread on its waker's CPU when it can ("wake
// affine"), so an unbound OpenMP worker, woken by the thread that launches the
// kernel, first shares that thread's CPU until the load balancer moves one of
// them. On a 2-core VM that took about half of a 1 ms call: a 512^3 fp32 GEMM
// with a passive wait cost 2.2 ms with unbound workers and 1.1 ms bound. (A
// long spin after each call hides it, but then our idle workers take the cores
// from numpy's threads in code that alternates the two libraries.)
// OMP_PROC_BIND binds them too, but binds the calling thread as well: the
// user's main thread, and every thread it starts later, would be confined to
// one CPU. So only the workers are bound, each to a CPU of the process's set
// other than the one the calling thread is on, re-bound only when that changes.
// Where the user set OMP_PROC_BIND or OMP_PLACES (to anything, "false"
// too), OpenMP's binding is left alone, and so is a team larger than the
// process's CPU set (it shares CPUs anyway); on systems other than Linux
// nothing is bound. A bound worker stays bound after the region: other
// OpenMP code in the process that shares the runtime's workers finds them
// where the last kernel left them.
#pragma once

#include <omp.h>

#include <cstdlib>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <vector>
#endif

namespace dcpu {

class WorkerPlacement {
  public:
    // In the calling thread, before the parallel region.
    WorkerPlacement() {
#if defined(__linux__)
        if (binds()) caller_ = sched_getcpu();
#endif
    }

    // In every thread of the region, first: binds worker `rank` (> 0) of a
    // team of `team` to the rank-th CPU of the process's set after skipping
    // the caller's. The worker's current mask is asked each time: the
    // OpenMP runtime's workers are shared by every kernel library, and
    // another may have bound this one elsewhere since.
    void settle(int rank, int team) const {
#if defined(__linux__)
        if (caller_ < 0 || rank == 0) return;
        const std::vector<int>& cpus = process_cpus();
        if (cpus.size() < 2 || size_t(team) > cpus.size()) return;
        const size_t i = size_t(rank - 1) % (cpus.size() - 1);  // among the CPUs but the caller's
        const size_t caller_at = std::lower_bound(cpus.begin(), cpus.end(), caller_) - cpus.begin();
        const int cpu = cpus[i < caller_at ? i : i + 1];
        cpu_set_t mask;
        CPU_ZERO(&mask);
        if (pthread_getaffinity_np(pthread_self(), sizeof mask, &mask) == 0 && CPU_COUNT(&mask) == 1 &&
            CPU_ISSET(cpu, &mask))
            return;
        CPU_ZERO(&mask);
        CPU_SET(cpu, &mask);
        pthread_setaffinity_np(pthread_self(), sizeof mask, &mask);
#else
        (void)rank;
        (void)team;
#endif
    }

  private:
#if defined(__linux__)
    // Whether workers are placed here at all: asked once, as the OpenMP
    // runtime reads OMP_PROC_BIND and OMP_PLACES once (the environment is
    // not walked on every call), and the CPU set read then too.
    static bool binds() {
        static const bool yes = [] {
            if (omp_get_proc_bind() != omp_proc_bind_false || std::getenv("OMP_PROC_BIND") ||
                std::getenv("OMP_PLACES"))
                return false;
            process_cpus();  // read from this thread's mask, before any worker is bound
            return true;
        }();
        return yes;
    }
    // The CPUs this process may run on, sorted, read once from the first
    // calling thread's mask (which its workers inherit).
    static const std::vector<int>& process_cpus() {
        static const std::vector<int> cpus = [] {
            std::vector<int> found;
            cpu_set_t mask;
            CPU_ZERO(&mask);
            if (sched_getaffinity(0, sizeof mask, &mask) == 0)
                for (int c = 0; c < CPU_SETSIZE; ++c)
                    if (CPU_ISSET(c, &mask)) found.push_back(c);
            return found;
        }();
        return cpus;
    }
    int caller_ = -1;
#endif
};

}  // namespace dcpu
