// Runs built gemm-dispatcher libraries under qemu-aarch64 for tests/test_neon_qemu.py.
//
// The libraries are the product's own shared objects (same flags, same C ABI),
// loaded with dlopen as the Python loader does, so what runs under emulation
// is exactly what an aarch64 machine would run. Python writes the operands
// (C already poisoned, or holding beta's input) as raw files and a job file
// of one case per line:
//
//   gemm <lib> <alpha> <beta> <m> <n> <k> <lda> <ldb> <ldc> <a> <b> <c>
//   grouped <lib> <alpha> <beta> <groups> {<m> <n> <k> <lda> <ldb> <ldc> <a> <b> <c>}...
//
// Each case overwrites its C files with what the kernel left there and prints
// one line: "case <index> status <status> name <kernel name> error <message>".
#include <dlfcn.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatcher_abi.h"

namespace {

using Bytes = std::vector<char>;

// The file's bytes and one spare byte, so even an empty operand has a
// non-null pointer (kernels reject null ones).
Bytes read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path);
    Bytes data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    data.push_back(0);
    return data;
}

void write_file(const std::string& path, const Bytes& data) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size() - 1));  // not the spare byte
    if (!out) throw std::runtime_error("cannot write " + path);
}

struct Library {
    void* handle;
    std::string name;

    explicit Library(const std::string& path) : handle(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        if (!handle) throw std::runtime_error(std::string("dlopen: ") + dlerror());
        if (symbol<int (*)()>("dispatcher_abi_version")() != DISPATCHER_ABI_VERSION)
            throw std::runtime_error("ABI version mismatch in " + path);
        name = symbol<const char* (*)()>("dispatcher_kernel_name")();
    }
    template <class F>
    F symbol(const char* name, bool required = true) const {
        void* p = dlsym(handle, name);
        if (!p && required) throw std::runtime_error(std::string("missing export ") + name);
        return reinterpret_cast<F>(p);
    }
    std::string last_error() const { return symbol<const char* (*)()>("dispatcher_last_error")(); }
};

// One problem's operands: A and B as read, C as read and written back after the launch.
struct Operands {
    int64_t m, n, k, lda, ldb, ldc;
    Bytes a, b, c;
    std::string c_path;

    explicit Operands(std::istream& job) {
        std::string a_path, b_path;
        job >> m >> n >> k >> lda >> ldb >> ldc >> a_path >> b_path >> c_path;
        if (!job) throw std::runtime_error("malformed job line");
        a = read_file(a_path);
        b = read_file(b_path);
        c = read_file(c_path);
    }
    void write_back() const { write_file(c_path, c); }
};

int run_gemm(const Library& lib, double alpha, double beta, std::istream& job) {
    Operands op(job);
    dispatcher_gemm_args args{op.a.data(), op.b.data(), op.c.data(), op.m, op.n, op.k, op.lda,
                              op.ldb, op.ldc, alpha, beta, nullptr, 0, 0, nullptr};
    // Stream-K asks for its workspace; the plugin zeroes it before a launch.
    Bytes workspace;
    if (auto size = lib.symbol<int64_t (*)(const dispatcher_gemm_args*)>("dispatcher_workspace_size", false)) {
        workspace.assign(static_cast<size_t>(size(&args)), 0);
        args.workspace = workspace.data();
        args.workspace_bytes = static_cast<int64_t>(workspace.size());
    }
    const int status = lib.symbol<dispatcher_gemm_fn>("dispatcher_run_gemm")(&args);
    op.write_back();
    return status;
}

int run_grouped(const Library& lib, double alpha, double beta, std::istream& job) {
    int64_t groups = -1;
    job >> groups;
    std::vector<Operands> ops;
    for (int64_t g = 0; g < groups; ++g) ops.emplace_back(job);
    std::vector<int64_t> m, n, k, lda, ldb, ldc;
    std::vector<const void*> a, b;
    std::vector<void*> c;
    for (auto& op : ops) {
        m.push_back(op.m), n.push_back(op.n), k.push_back(op.k);
        lda.push_back(op.lda), ldb.push_back(op.ldb), ldc.push_back(op.ldc);
        a.push_back(op.a.data()), b.push_back(op.b.data()), c.push_back(op.c.data());
    }
    dispatcher_grouped_args args{groups, m.data(), n.data(), k.data(), a.data(), b.data(), c.data(),
                                 lda.data(), ldb.data(), ldc.data(), alpha, beta, nullptr, 0, nullptr};
    const int status = lib.symbol<int (*)(const dispatcher_grouped_args*)>("dispatcher_run_grouped_gemm")(&args);
    for (const auto& op : ops) op.write_back();
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: neon_driver JOB_FILE\n";
        return 2;
    }
    std::ifstream jobs(argv[1]);
    std::string line;
    for (int index = 0; std::getline(jobs, line); ++index) {
        std::istringstream job(line);
        std::string kind, path;
        double alpha = 0, beta = 0;
        job >> kind >> path >> alpha >> beta;
        std::string name = "-", error;
        int status;
        try {
            Library lib(path);
            name = lib.name;
            status = kind == "grouped" ? run_grouped(lib, alpha, beta, job) : run_gemm(lib, alpha, beta, job);
            error = lib.last_error();
        } catch (const std::exception& e) {
            status = 99;
            error = e.what();
        }
        std::cout << "case " << index << " status " << status << " name " << name << " error " << error
                  << std::endl;
    }
    return 0;
}
