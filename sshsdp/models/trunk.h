// The decoder a model builds on when it replaces some blocks' MLP (MoeGpt, moe.h): the token
// embeddings, every block's attention half up to the second norm, the dense blocks, the final
// norm and the LM head, as pieces the outer model calls in its own group order. The dense GPT
// (gpt.h) and the Llama family (llama.h) are trunks; an MoE model over either is the GPT's MoE
// or Qwen3-MoE.
//
//   std::unique_ptr<Trunk> t = std::make_unique<Llama>(config, backend, /*mlp=*/dense_blocks);
//   t->ForwardAttention(l, w);              // block l up to Ln2(l)
//   ...                                     // the outer model's MLP: Ln2(l) -> BlockOut(l)
//   t->BackwardAttention(l, w, grad, acc);  // from DRes() and DLn2()
#pragma once

#include <cstdint>
#include <vector>

#include "sshsdp/params/model.h"

namespace sshsdp {

class Trunk : public Model {
 public:
  // Group 0 whole, and its backward.
  virtual void ForwardEmbedding(const std::vector<TensorRef>& w) = 0;
  virtual void BackwardEmbedding(const std::vector<TensorRef>& grad, bool acc) = 0;
  // The last group whole (with group 0's views appended when TiesFirstGroup), and its backward.
  virtual void ForwardHead(const std::vector<TensorRef>& w) = 0;
  virtual void BackwardHead(const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                            bool acc) = 0;
  // Block l with its dense MLP (the views of its group), and its backward.
  virtual void ForwardBlock(int l, const std::vector<TensorRef>& w) = 0;
  virtual void BackwardBlock(int l, const std::vector<TensorRef>& w,
                             const std::vector<TensorRef>& grad, bool acc) = 0;
  // Block l up to Ln2(l) = RMSNorm(ResMid(l)), from the first AttentionViews() views of its
  // group; and from DRes() = ∂/∂BlockOut(l) and DLn2() = ∂/∂Ln2(l): DRes() = ∂/∂(block l's
  // input) and the gradients of those views.
  virtual void ForwardAttention(int l, const std::vector<TensorRef>& w) = 0;
  virtual void BackwardAttention(int l, const std::vector<TensorRef>& w,
                                 const std::vector<TensorRef>& grad, bool acc) = 0;
  virtual float* Ln2(int l) const = 0;
  virtual float* ResMid(int l) const = 0;
  virtual float* BlockOut(int l) const = 0;
  virtual float* DRes() const = 0;
  virtual float* DLn2() const = 0;

  // Views of a block group before its dense MLP (the attention half's), and of a dense block.
  virtual int AttentionViews() const = 0;
  virtual int DenseBlockViews() const = 0;
  // GEMM weight elements of one block's attention (QKV and output projections), of one dense
  // MLP, and of the LM head; attention's score and value FLOPs per token over all blocks for
  // sequences of T tokens (PaLM's 12·L·width·T).
  virtual double AttentionWeights() const = 0;
  virtual double DenseMlpWeights() const = 0;
  virtual double HeadWeights() const = 0;
  virtual double AttentionFlopsPerToken(double T) const = 0;
};

}  // namespace sshsdp
