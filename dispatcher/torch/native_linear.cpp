// dispatcher.torch.Linear's warm eager calls in C++ (dispatcher/torch/native.py
// builds this file into the build cache and loads it).
//
// A Python call costs microseconds per step (the key, the plan lookup, the
// argument block, an autograd.Function and its backward), which a small
// layer's kernel does not: this module runs the whole call, forward and
// backward, from plans the Python side made. A `Plans` object (one per
// Linear) maps what a call's plan depends on (shapes, strides, dtypes,
// device and stream of x, the weight and the bias) to the launches Python
// bound: the forward GEMM with its fused bias and, where gradients are
// wanted, the two backward GEMMs. `forward` returns None for a call it has
// no plan for, and for calls whose backward launch is not planned yet (the
// first few, then at doubling intervals); the Python path then runs it
// (and makes the plans).
//
// A launch is what `dispatcher.plans.Plan.runner` binds: the kernel's entry
// point, the plan's argument block with its scalars (copied per call, so a
// call nested in another or on another thread has its own) and the result's
// shape and dtype; each call points the block at its tensors and a new
// output from torch's allocator.
//
// A `Product` is one such launch on its own, for products c = act(a @ b +
// bias) (the core's `dispatcher.gemm(a, b)` and `matmul` on CUDA tensors,
// held plans; plain products into an output given, too), and `Products` the
// core's table of them; a plugin registration makes every Product stale.
#include <torch/extension.h>

#include <array>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatcher_abi.h"

namespace {

namespace py = pybind11;

constexpr int kMaxExtra = 4;

struct Launch {
    dispatcher_gemm_fn entry = nullptr;
    const char* (*last_error)() = nullptr;
    dispatcher_gemm_args block{};
    std::array<dispatcher_operand, kMaxExtra> extra{};  // the extra operands' strides; data per call
    int64_t batch = 0, rows = 0, cols = 0;  // batch 0: a 2-D result
    at::ScalarType out = at::kFloat;
    int64_t workspace = 0;  // scratch bytes each call needs (a stream-K or split-K kernel's partials)
    bool zeroed = false;    // whether they must be zeroed first (the target's `zeroes_workspace`)

    // c = a @ b (+ the bias, extra operand 0): into `into` where given (checked
    // by the caller: `fits_out`), else a new (rows x cols, or batch x rows x
    // cols) result of `a`'s device.
    at::Tensor operator()(const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias = nullptr,
                          const at::Tensor* into = nullptr) const {
        at::Tensor c = into ? *into
                     : batch ? at::empty({batch, rows, cols}, a.options().dtype(out))
                             : at::empty({rows, cols}, a.options().dtype(out));
        dispatcher_gemm_args args = block;
        std::array<dispatcher_operand, kMaxExtra> operands = extra;
        args.a = a.data_ptr();
        args.b = b.data_ptr();
        args.c = c.data_ptr();
        if (args.extra_count > 0) {
            if (!bias) throw std::logic_error("a planned launch with a bias got none");
            operands[0].data = bias->data_ptr();
            args.extra = operands.data();
        }
        // Scratch from torch's allocator, on the current stream as the kernel: released when
        // this returns, it is reused only by work queued after the kernel on that stream (and
        // under graph capture it comes from the graph's own pool), so calls never share it.
        at::Tensor scratch;
        if (workspace > 0) {
            const auto bytes = a.options().dtype(at::kByte);
            scratch = zeroed ? at::zeros({workspace}, bytes) : at::empty({workspace}, bytes);
            args.workspace = scratch.data_ptr();
            args.workspace_bytes = workspace;
        }
        int status;
        if (PyGILState_Check()) {  // a forward from Python: other Python threads run meanwhile, as
            py::gil_scoped_release unlocked;  // during a ctypes call
            status = entry(&args);
        } else {  // a backward, in torch's autograd engine, which runs without the GIL
            status = entry(&args);
        }
        if (status != 0)
            throw std::runtime_error(std::string("gemm-dispatcher kernel failed (status ") +
                                     std::to_string(status) + "): " + (last_error ? last_error() : ""));
        return c;
    }
};

// A Python launch description: (entry address, last-error address, argument
// block bytes, extra operands' (row, col, batch) strides, rows, cols, output
// dtype, batch: the leading dim of a 3-D result, 0 for a 2-D one, scratch
// bytes per call, whether they are zeroed first). The
// addresses stay valid: a kernel library, once loaded, is never unloaded.
Launch launch_of(const py::tuple& spec) {
    Launch l;
    l.entry = reinterpret_cast<dispatcher_gemm_fn>(spec[0].cast<uintptr_t>());
    l.last_error = reinterpret_cast<const char* (*)()>(spec[1].cast<uintptr_t>());
    const std::string block = spec[2].cast<std::string>();
    if (block.size() != sizeof(dispatcher_gemm_args))
        throw std::invalid_argument("argument block of " + std::to_string(block.size()) + " bytes, expected " +
                                    std::to_string(sizeof(dispatcher_gemm_args)));
    std::memcpy(&l.block, block.data(), sizeof l.block);
    const auto strides = spec[3].cast<std::vector<std::array<int64_t, 3>>>();
    if (int64_t(strides.size()) != l.block.extra_count || strides.size() > kMaxExtra)
        throw std::invalid_argument("extra operand strides do not match the block's extra_count");
    for (size_t i = 0; i < strides.size(); ++i)
        l.extra[i] = {nullptr, strides[i][0], strides[i][1], strides[i][2]};
    l.block.a = l.block.b = nullptr;
    l.block.c = nullptr;
    l.block.extra = nullptr;
    if (l.block.param_count != 0)
        throw std::invalid_argument("a launch with parameters is not planned natively");
    l.rows = spec[4].cast<int64_t>();
    l.cols = spec[5].cast<int64_t>();
    l.out = py::reinterpret_borrow<py::object>(spec[6]).cast<at::ScalarType>();
    l.batch = spec[7].cast<int64_t>();
    l.workspace = spec[8].cast<int64_t>();
    l.zeroed = spec[9].cast<bool>();
    l.block.workspace = nullptr;
    l.block.workspace_bytes = 0;
    return l;
}

// What a call's plans depend on (a Linear's; a product's, whose operands may
// be batched: 3-D).
using Key = std::array<int64_t, 27>;

int64_t stream_of(const at::Tensor& t) {
    if (!t.is_cuda()) return 0;
    return c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).id();
}

// A CUDA plan holds for one alignment class (`dispatcher.plans._alignment`).
int64_t aligned(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// x and w are 2-D, or 3-D (a batch of matrices: its size and stride are in
// the key too). `w_transposed`: the key of w's last two dims swapped, in w's
// place, read off w (a plain product's b, whose transposed view would cost
// an allocation per call).
Key key_of(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
           bool w_transposed = false) {
    const bool b = bias.has_value() && bias->defined();
    const int64_t xd = x.dim(), wd = w.dim();
    const int64_t xr = xd - 2, xc = xd - 1;  // x's matrix dims
    const int64_t wr = w_transposed ? wd - 1 : wd - 2, wc = w_transposed ? wd - 2 : wd - 1;
    return {x.size(xr), x.size(xc), x.stride(xr), x.stride(xc), w.size(wr), w.size(wc), w.stride(wr), w.stride(wc),
            b ? bias->size(0) : -1, b ? bias->stride(0) : -1, int64_t(x.scalar_type()),
            int64_t(w.scalar_type()), b ? int64_t(bias->scalar_type()) : -1, int64_t(x.device().type()),
            x.device().index(), stream_of(x), b ? int64_t(bias->device().type()) : -1,
            int64_t(w.device().type()), aligned(x) | aligned(w) << 1 | (b && aligned(*bias)) << 2,
            w.device().index(), b ? bias->device().index() : -1,
            xd, xd == 3 ? x.size(0) : -1, xd == 3 ? x.stride(0) : -1,
            wd, wd == 3 ? w.size(0) : -1, wd == 3 ? w.stride(0) : -1};
}

// Whether native launches can take `t` as it is: a view whose values are
// not its memory's (torch's negative bit, a zero tensor) must be resolved.
bool plain_memory(const at::Tensor& t) { return !t.is_neg() && !t.is_conj() && !t._is_zerotensor(); }

// Held by the Plans that made it and by every autograd graph recorded with
// it (until that graph's backward has run or it is freed).
struct Planned : torch::CustomClassHolder {
    Key key;
    Launch forward;                           // y = x @ w^T (+ bias)
    std::shared_ptr<const Launch> dx, dw;     // dX = dY @ W, dW = dY^T @ X (null: not planned)
    std::string variant;                      // the Linear's variant and autotune, for
    std::optional<bool> autotune;             // `gemm_op`
    int64_t misses = 0;                       // calls wanting a backward launch not planned (`Plans::forward`)
};

// a @ b through the operator `gemm_dispatcher::gemm` (its Python kernel, the
// same plans): differentiable, for a backward that records a graph of its
// own (create_graph=True), which the launches above do not.
at::Tensor gemm_op(const at::Tensor& a, const at::Tensor& b, const Planned& p) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("gemm_dispatcher::gemm", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, double,
                              double, std::optional<at::ScalarType>, c10::string_view,
                              std::optional<c10::string_view>, std::optional<bool>)>();
    return op.call(a, b, std::nullopt, 1.0, 0.0, std::nullopt, p.variant, std::nullopt, p.autotune);
}

// a @ b through the operator, laid out as `like` (a column-major `like`
// gets the row-major b^T a^T viewed transposed), as the Python backward
// (`ops._product_like`) lays out each gradient as its input.
at::Tensor product_like(const at::Tensor& like, const at::Tensor& a, const at::Tensor& b, const Planned& p) {
    const bool column_major = like.stride(0) == 1 && like.stride(1) != 1 && like.size(0) > 1;
    return column_major ? gemm_op(b.t(), a.t(), p).t() : gemm_op(a, b, p);
}

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                              const c10::optional<at::Tensor>& bias, const c10::intrusive_ptr<Planned>& p) {
        ctx->save_for_backward({x, w});
        ctx->saved_data["planned"] = c10::IValue::make_capsule(p);
        ctx->saved_data["bias_dtype"] = bias.has_value() ? int64_t(bias->scalar_type()) : int64_t(-1);
        const at::Tensor transposed = w.t();
        return p->forward(x, transposed, bias.has_value() ? &*bias : nullptr);
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        const auto p = c10::static_intrusive_pointer_cast<Planned>(ctx->saved_data["planned"].toCapsule());
        const auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &w = saved[1];
        at::Tensor dx, dw, db;
        // the planned operand: row-major in x's dtype (an expanded or cast gradient is made so once)
        const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
        // The planned launches, where they are planned (for row-major x and w), the gradient is
        // aligned (a CUDA plan holds for one alignment class; contiguous() keeps a view's offset)
        // and no graph is recorded (create_graph: the operator records the products).
        const bool launches = !at::GradMode::is_enabled() && (!dy.is_cuda() || aligned(dy));
        if (ctx->needs_input_grad(0)) dx = launches && p->dx ? (*p->dx)(dy, w) : product_like(x, dy, w, *p);
        if (ctx->needs_input_grad(1)) dw = launches && p->dw ? (*p->dw)(dy.t(), x) : product_like(w, dy.t(), x, *p);
        const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
        if (bias_dtype >= 0 && ctx->needs_input_grad(2))
            db = grads[0].sum(0).to(at::ScalarType(bias_dtype));
        return {dx, dw, db, at::Tensor()};
    }
};

// The plans of one Linear's calls, few shapes each, searched in order.
class Plans {
  public:
    static constexpr size_t kKept = 64;  // kinds of call before the list starts again
    static constexpr int kMisses = 4;

    // y, or None where no plan fits the call (or gradients are wanted of an
    // input whose backward launch is not planned yet).
    py::object forward(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
        const c10::intrusive_ptr<Planned> p = find(x, w, bias);  // held: `add` may replace it meanwhile
        if (!p) return py::none();
        const bool grad = at::GradMode::is_enabled() &&
                          (x.requires_grad() || w.requires_grad() || (bias.has_value() && bias->requires_grad()));
        if (!grad) {
            const at::Tensor transposed = w.t();
            return py::cast(p->forward(x, transposed, bias.has_value() ? &*bias : nullptr));
        }
        // A backward launch not planned yet: the first calls go the Python way, so the first
        // backward plans it; after kMisses, the backward computes it through the operator,
        // and calls at doubling intervals still go the Python way, to plan the launches
        // that such backwards (the operator's plans) have made possible since.
        if ((x.requires_grad() && !p->dx) || (w.requires_grad() && !p->dw)) {
            const int64_t misses = ++p->misses;
            if (misses <= kMisses || (misses & (misses - 1)) == 0) return py::none();
        }
        return py::cast(LinearFunction::apply(x, w, bias, p));
    }

    // What is planned for calls like (x, w, bias): 1 the forward, 2 dX, 4 dW (0: nothing).
    int planned(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
        const c10::intrusive_ptr<Planned> p = find(x, w, bias);
        return p ? 1 | (p->dx ? 2 : 0) | (p->dw ? 4 : 0) : 0;
    }

    // Plans calls like (x, w, bias): the forward launch and the backward
    // launches given (None: keep what is planned).
    void add(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
             const py::tuple& forward, const py::object& dx, const py::object& dw, const std::string& variant,
             std::optional<bool> autotune) {
        auto p = c10::make_intrusive<Planned>();
        p->key = key_of(x, w, bias);
        p->variant = variant;
        p->autotune = autotune;
        p->forward = launch_of(forward);
        if (!dx.is_none()) p->dx = std::make_shared<const Launch>(launch_of(dx.cast<py::tuple>()));
        if (!dw.is_none()) p->dw = std::make_shared<const Launch>(launch_of(dw.cast<py::tuple>()));
        for (auto& q : planned_)
            if (q->key == p->key) {
                if (!p->dx) p->dx = q->dx;
                if (!p->dw) p->dw = q->dw;
                q = std::move(p);
                return;
            }
        if (planned_.size() >= kKept) planned_.clear();  // many shapes: start again rather than keep them all
        planned_.push_back(std::move(p));
    }

    // Forget every plan (a plugin registration changed what selection chooses).
    void clear() { planned_.clear(); }

    size_t size() const { return planned_.size(); }

  private:
    c10::intrusive_ptr<Planned> find(const at::Tensor& x, const at::Tensor& w,
                                     const c10::optional<at::Tensor>& bias) const {
        if (x.dim() != 2 || w.dim() != 2 || (bias.has_value() && bias->dim() != 1)) return {};
        if (!plain_memory(x) || !plain_memory(w) || (bias.has_value() && !plain_memory(*bias))) return {};
        // a CUDA kernel launches on the current device: the one its plan was made on
        if (x.is_cuda() && c10::impl::getDeviceGuardImpl(x.device().type())->getDevice() != x.device())
            return {};
        const Key key = key_of(x, w, bias);
        for (const auto& q : planned_)
            if (q->key == key) return q;
        return {};
    }

    std::vector<c10::intrusive_ptr<Planned>> planned_;
};

// Calls of `Products::clear_all` so far: a Product made before the last one is stale.
std::atomic<uint64_t> generation{0};

// The key of a product a @ b (+ a bias: one value per column of the result,
// 1-D; as `key_of` of linear(a, b^T, bias)), or false where no launch can
// take the tensors as they are. `batched`: a and b may be 3-D (matmul's
// batches; gemm's products are of matrices only).
bool product_key(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& bias, Key* key,
                 bool batched = false) {
    const int64_t top = batched ? 3 : 2;
    if (a.dim() < 2 || a.dim() > top || b.dim() < 2 || b.dim() > top || !plain_memory(a) || !plain_memory(b))
        return false;
    if (bias.has_value() && (bias->dim() != 1 || !plain_memory(*bias))) return false;
    if (a.is_cuda() && c10::impl::getDeviceGuardImpl(a.device().type())->getDevice() != a.device())
        return false;  // a CUDA kernel launches on the current device: the one its plan was made on
    *key = key_of(a, b, bias, /*w_transposed=*/true);
    return true;
}

// The bytes a tensor's elements span, [first, last); none where it is empty.
std::pair<uintptr_t, uintptr_t> extent(const at::Tensor& t) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(t.data_ptr());
    if (t.numel() == 0) return {start, start};
    int64_t low = 0, high = 0;
    for (int64_t i = 0; i < t.dim(); ++i) (t.stride(i) < 0 ? low : high) += (t.size(i) - 1) * t.stride(i);
    return {start + low * t.element_size(), start + (high + 1) * t.element_size()};
}

// Whether a launch may write its 2-D result into `out` as the plan it came
// from did: row-major, the result's shape and dtype, on a's device, wanting
// no gradient, of the plan's alignment class and apart from a's and b's
// bytes (bounds only: what interleaves goes the Python way, which decides).
bool fits_out(const Launch& l, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool out_aligned) {
    if (l.batch || out.dim() != 2 || out.size(0) != l.rows || out.size(1) != l.cols || out.scalar_type() != l.out ||
        out.stride(1) != 1 || out.stride(0) != l.cols || out.device() != a.device() || out.requires_grad() ||
        !plain_memory(out) || bool(aligned(out)) != out_aligned)
        return false;
    const auto o = extent(out);
    if (o.first == o.second) return true;
    for (const at::Tensor* x : {&a, &b}) {
        const auto e = extent(*x);
        if (e.first < o.second && o.first < e.second) return false;
    }
    return true;
}

// A call's activation (None or its name) as a product holds it: "" for
// none; false for what no product has (an empty name too, which the Python
// way refuses).
bool activation_of(py::handle activation, std::string* name) {
    if (activation.is_none()) {
        name->clear();
        return true;
    }
    if (!PyUnicode_Check(activation.ptr())) return false;
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(activation.ptr(), &size);
    if (!text || size == 0) {
        PyErr_Clear();
        return false;
    }
    name->assign(text, size);
    return true;
}

// One plan's launch of products c = act(a @ b + bias) on tensors of one key
// (shapes, strides, dtypes, device, stream, alignment) and one activation
// (the epilogue its kernel fuses): a held plan's (`dispatcher.plan`: plain
// products), the core's plain `gemm(a, b)` / `matmul(a, b)` and `matmul`
// with a bias and an activation; `into` (the example's out: its alignment
// class): plain products into an output given, row-major (`gemm(a, b,
// out=out)`, `matmul(a, b, out=out)`, a held plan's `plan(a, b, out=out)`). No
// autograd: like the core's Python way, the result records no graph.
class Product {
  public:
    Product(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& bias,
            const std::string& activation, const py::tuple& launch, const c10::optional<at::Tensor>& into)
        : launch_(launch_of(launch)), activation_(activation), generation_(generation.load()),
          into_(into.has_value()), out_aligned_(into.has_value() && aligned(*into)) {
        if (!product_key(a, b, bias, &key_, /*batched=*/true))
            throw std::invalid_argument("a product's example tensors are not plain");
        if (launch_.block.extra_count != (bias.has_value() ? 1 : 0))
            throw std::invalid_argument("a product's launch takes one extra operand, its bias, or none");
        if (into_ && (bias.has_value() || !activation.empty() || !fits_out(launch_, *into, a, b, out_aligned_)))
            throw std::invalid_argument("a product into an out takes a plain, row-major out of its result");
    }

    // False once `Products::clear_all` has made it stale.
    bool current() const { return generation_ == generation.load(); }
    bool fits(const Key& key, const std::string& activation, bool into = false) const {
        return key == key_ && activation == activation_ && into == into_ && current();
    }

    // a @ b (a plain product's launch: a held plan's), into `out` for a
    // product into an out (None: not a tensor), or None for tensors of
    // another key or an out it may not write (or once stale).
    py::object call(const at::Tensor& a, const at::Tensor& b, const at::Tensor* out = nullptr) const {
        Key key;
        if (!product_key(a, b, c10::nullopt, &key, /*batched=*/true) || !fits(key, std::string(), out != nullptr))
            return py::none();
        if (out && !fits_out(launch_, *out, a, b, out_aligned_)) return py::none();
        return py::cast(launch_(a, b, nullptr, out));
    }

    at::Tensor operator()(const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias) const {
        return launch_(a, b, bias);
    }

  private:
    Key key_;
    Launch launch_;
    std::string activation_;
    uint64_t generation_;
    bool into_, out_aligned_;
};

// The core's products on tensors (`dispatcher.gemm(a, b)` and `matmul` on
// CUDA tensors), few kinds each, searched in order.
class Products {
  public:
    static constexpr size_t kKept = 64;  // kinds of call before the list starts again

    // act(a @ b + bias), or None where no product fits (bias: None or a
    // tensor; activation: None or a name; batched: a and b may be 3-D).
    py::object call(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& bias,
                    py::handle activation, bool batched) const {
        Key key;
        std::string name;
        if (!product_key(a, b, bias, &key, batched) || !activation_of(activation, &name)) return py::none();
        for (const auto& p : products_)
            if (p->fits(key, name)) {
                const std::shared_ptr<const Product> held = p;  // kept while the kernel runs without the GIL
                ++hits_;
                return py::cast((*held)(a, b, bias.has_value() ? &*bias : nullptr));
            }
        return py::none();
    }

    // a @ b into `out` (a plain product, matrices only), or None where no
    // product into an out fits (`Product::call`).
    py::object into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) const {
        Key key;
        if (!product_key(a, b, c10::nullopt, &key)) return py::none();
        for (const auto& p : products_)
            if (p->fits(key, std::string(), /*into=*/true)) {
                const std::shared_ptr<const Product> held = p;  // kept while the kernel runs without the GIL
                py::object result = held->call(a, b, &out);
                if (result.is_none()) continue;  // an out of another alignment class: maybe the next one's
                ++hits_;
                return result;
            }
        return py::none();
    }

    // Calls it ran so far.
    uint64_t hits() const { return hits_; }

    // Runs the calls of p's key with p, unless p is stale (a registration
    // came between its plan's check and now).
    void add(std::shared_ptr<const Product> p) {
        if (!p->current()) return;
        if (products_.size() >= kKept) products_.clear();  // many kinds: start again rather than keep them all
        products_.push_back(std::move(p));
    }

    // Forget every product, and make every Product stale (a plugin registration).
    void clear_all() {
        ++generation;
        products_.clear();
    }

    size_t size() const { return products_.size(); }

  private:
    std::vector<std::shared_ptr<const Product>> products_;
    mutable uint64_t hits_ = 0;  // under the GIL
};

// Whether both are tensors the core takes: a Tensor or a Parameter, not a
// subclass (whose __torch_function__ may mean something else), as
// `dispatcher.api.operands_key` rules.
bool tensors(py::handle a, py::handle b) { return THPVariable_CheckExact(a.ptr()) && THPVariable_CheckExact(b.ptr()); }

}  // namespace

PYBIND11_MODULE(dispatcher_torch_native, m) {
    m.doc() = "dispatcher.torch.Linear's warm eager calls (dispatcher/torch/native.py)";
    m.attr("ABI_VERSION") = DISPATCHER_ABI_VERSION;
    m.attr("ARGS_BYTES") = sizeof(dispatcher_gemm_args);
    py::class_<Plans>(m, "Plans")
        .def(py::init<>())
        .def("forward", &Plans::forward, py::arg("x"), py::arg("weight"), py::arg("bias"))
        .def("planned", &Plans::planned)
        .def("add", &Plans::add)
        .def("clear", &Plans::clear)
        .def("__len__", &Plans::size);
    py::class_<Product, std::shared_ptr<Product>>(m, "Product")
        .def(py::init<const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, const std::string&,
                      const py::tuple&, const c10::optional<at::Tensor>&>(),
             py::arg("a"), py::arg("b"), py::arg("bias"), py::arg("activation"), py::arg("launch"),
             py::arg("into") = py::none())
        .def_property_readonly("current", &Product::current)
        .def("__call__", [](const Product& self, py::handle a, py::handle b, py::handle out) {
            if (!tensors(a, b) || !(out.is_none() || THPVariable_CheckExact(out.ptr()))) return py::object(py::none());
            if (out.is_none()) return self.call(THPVariable_Unpack(a.ptr()), THPVariable_Unpack(b.ptr()));
            const at::Tensor& into = THPVariable_Unpack(out.ptr());
            return self.call(THPVariable_Unpack(a.ptr()), THPVariable_Unpack(b.ptr()), &into);
        }, py::arg("a"), py::arg("b"), py::arg("out") = py::none());
    py::class_<Products>(m, "Products")
        .def(py::init<>())
        .def("__call__", [](const Products& self, py::handle a, py::handle b) {  // gemm's and matmul's plain calls
            return tensors(a, b) ? self.call(THPVariable_Unpack(a.ptr()), THPVariable_Unpack(b.ptr()), c10::nullopt,
                                             py::none(), /*batched=*/false)
                                 : py::none();
        })
        .def("into", [](const Products& self, py::handle a, py::handle b, py::handle out) {  // ... with an out given
            return tensors(a, b) && THPVariable_CheckExact(out.ptr())
                       ? self.into(THPVariable_Unpack(a.ptr()), THPVariable_Unpack(b.ptr()), THPVariable_Unpack(out.ptr()))
                       : py::none();
        })
        .def("matmul", [](const Products& self, py::handle a, py::handle b, py::handle bias, py::handle activation) {
            if (!tensors(a, b)) return py::object(py::none());
            if (bias.is_none())
                return self.call(THPVariable_Unpack(a.ptr()), THPVariable_Unpack(b.ptr()), c10::nullopt, activation,
                                 /*batched=*/true);
            if (!THPVariable_CheckExact(bias.ptr())) return py::object(py::none());
            return self.call(THPVariable_Unpack(a.ptr()), THPVariable_Unpack(b.ptr()), THPVariable_Unpack(bias.ptr()),
                             activation, /*batched=*/true);
        })
        .def("add", [](Products& self, std::shared_ptr<Product> p) { self.add(std::move(p)); },
             py::arg("product").none(false))
        .def("clear_all", &Products::clear_all)
        .def("hits", &Products::hits)
        .def("__len__", &Products::size);
}
