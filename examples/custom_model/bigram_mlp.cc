// Bring your own model: BigramMlp (bigram_mlp.h), trained by the installed library through its
// front door (sshsdp/sshsdp.h) on this job's ranks, fully sharded, then checkpointed.
//
//   mpirun -np 3 build/bigram_mlp out/ckpt       (any world size)
//
// bigram_mlp_check.cc holds the same training to a one-rank reference, step by step.
#include <cstdio>
#include <string>

#include "bigram_mlp.h"

int main(int argc, char** argv) {
  return sshsdp::RunMpiMain(argc, argv, [&] {
    std::unique_ptr<sshsdp::Backend> cpu = sshsdp::MakeCpuBackend();
    bigram::BigramMlp model(*cpu);
    sshsdp::SyntheticTokens data(bigram::V, /*seed=*/5);
    sshsdp::TrainerOptions opt;
    opt.engine.backend = cpu.get();  // the model computes where the engine runs
    opt.engine.microbatches = 2, opt.engine.batch_size = 4, opt.engine.seq_len = 16;
    opt.engine.adamw.lr = 1e-2f;
    opt.ckpt_dir = argc > 1 ? argv[1] : "out/custom_model";
    sshsdp::Trainer trainer(model, data, opt);
    for (int s = 0; s < 8; ++s) {
      const sshsdp::StepStats st = trainer.Step();
      if (trainer.rank() == 0) std::printf("step %d: loss %.4f\n", s + 1, st.loss);
    }
    const sshsdp::SaveResult saved = trainer.Save();
    if (trainer.rank() == 0) std::printf("saved %s\n", saved.dir.c_str());
    return 0;
  });
}
