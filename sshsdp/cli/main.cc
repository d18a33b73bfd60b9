// sshsdp: command-line entry point. `sshsdp train` trains a reference model on real MPI
// ranks (launch it with mpirun or srun --mpi=pmix); `sshsdp generate` samples from a
// checkpoint or weights file, `sshsdp ckpt` inspects and exports checkpoints, `sshsdp
// tokenize` turns text into token files, each in one process; `sshsdp bench` compares framework
// presets in one job; `sshsdp --help` lists the commands.
//
// `train --resume DIR` takes every option it is not given (on the command line or in
// --config) from the options the checkpoint recorded (run_config.h), so `--resume DIR` alone
// continues the run as it was launched.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/cli/bench.h"
#include "sshsdp/cli/ckpt_cli.h"
#include "sshsdp/cli/export_hf.h"
#include "sshsdp/cli/generate.h"
#include "sshsdp/cli/plan_cli.h"
#include "sshsdp/cli/run_config.h"
#include "sshsdp/cli/tokenize.h"
#include "sshsdp/cli/train.h"

namespace {

struct Commands {
  sshsdp::TrainOptions train;
  sshsdp::CkptOptions ckpt;
  sshsdp::BenchOptions bench;
  sshsdp::GenerateOptions generate;
  sshsdp::PlanOptions plan;
  sshsdp::TokenizeOptions tokenize;
  sshsdp::ExportHfOptions export_hf;
  CLI::App *t = nullptr, *c = nullptr, *b = nullptr, *g = nullptr, *p = nullptr, *k = nullptr,
           *x = nullptr;
};

std::unique_ptr<CLI::App> MakeApp(Commands& cmd) {
  auto app = std::make_unique<CLI::App>(
      "sshsdp: sharded data-parallel training with runtime/update parameter decoupling.\n"
      "Launch multi-rank runs with mpirun (or srun --mpi=pmix), e.g.\n"
      "  mpirun -np 4 sshsdp train --model tiny --steps 100    (fully sharded over 4 ranks)");
  app->require_subcommand(1);
  // A later flag overrides an earlier one (scripts/run.sh passes defaults the user may
  // override; a resume puts the checkpoint's options before the user's).
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd.t = app->add_subcommand("train", "train a reference model (run under mpirun)");
  sshsdp::AddTrainOptions(*cmd.t, cmd.train);
  cmd.p = app->add_subcommand(
      "plan",
      "print what a train run will allocate and move on every rank: memory by category, bytes "
      "of every collective (intra / inter node), the Muon update plan, the ZeRO-1 owner map "
      "(one process, no mpirun; takes train's options, e.g. sshsdp plan -n 4 --model small)");
  sshsdp::AddPlanOptions(*cmd.p, cmd.plan);
  cmd.g = app->add_subcommand(
      "generate", "sample text from a checkpoint or safetensors file (one process, no mpirun)");
  sshsdp::AddGenerateOptions(*cmd.g, cmd.generate);
  cmd.k = app->add_subcommand(
      "tokenize",
      "turn text files into token files with a Hugging Face tokenizer.json (one process)");
  sshsdp::AddTokenizeOptions(*cmd.k, cmd.tokenize);
  cmd.c = app->add_subcommand(
      "ckpt", "inspect, verify and export sharded checkpoints (one process, no mpirun)");
  sshsdp::AddCkptCommands(*cmd.c, cmd.ckpt);
  cmd.x = app->add_subcommand("export-hf",
                              "write a Llama-family checkpoint or weights file as a Hugging Face "
                              "model directory (one process, no mpirun)");
  sshsdp::AddExportHfOptions(*cmd.x, cmd.export_hf);
  cmd.b = app->add_subcommand(
      "bench", "compare framework presets (fsdp2, megatron-fsdp, vescale-fsdp, sshsdp) in one job");
  sshsdp::AddBenchOptions(*cmd.b, cmd.bench);
  return app;
}

// CLI11's "Could not convert: --steps = 99999999999" with what the option takes: its kind (the
// option's type name) and, for whole numbers, that it must fit the option.
void ConversionMessage(const CLI::App& app, const std::string& what) {
  const size_t colon = what.find(": "), eq = what.find(" = ");
  if (colon == std::string::npos || eq == std::string::npos || eq < colon) {
    fmt::print(stderr, "{}\nRun with --help for more information.\n", what);
    return;
  }
  const std::string name = what.substr(colon + 2, eq - colon - 2), value = what.substr(eq + 3);
  std::string kind = "a value";
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (const CLI::Option* o = sub->get_option_no_throw(name)) kind = o->get_type_name();
  const bool whole = kind.find("INT") != std::string::npos;
  fmt::print(stderr, "sshsdp: {} {}: not {}{}\nRun with --help for more information.\n", name,
             value, whole ? "a whole number in the option's range" : "a valid " + kind,
             whole ? " (counts such as --steps take at most 2147483647)" : "");
}

// Parses `user` (argv[1..]) with `prefix` inserted right after "train" (or "plan"): later
// arguments win.
bool Parse(std::unique_ptr<Commands>& cmd, std::unique_ptr<CLI::App>& app,
           const std::vector<std::string>& user, const std::vector<std::string>& prefix,
           int* exit_code, const std::string& source = "") {
  cmd = std::make_unique<Commands>();
  app = MakeApp(*cmd);
  std::vector<std::string> args;
  size_t i = 0;
  while (i < user.size() && user[i] != "train" && user[i] != "plan") args.push_back(user[i++]);
  if (i < user.size()) args.push_back(user[i++]);
  args.insert(args.end(), prefix.begin(), prefix.end());
  args.insert(args.end(), user.begin() + static_cast<std::ptrdiff_t>(i), user.end());
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  try {
    app->parse(args);
  } catch (const CLI::ParseError& e) {
    // A value from a file is named with the file (CLI11 sees only "--steps=2.5").
    if (!source.empty() && e.get_exit_code() != 0) fmt::print(stderr, "sshsdp: in {}:\n", source);
    if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
      ConversionMessage(*app, e.what());
      *exit_code = e.get_exit_code();
      return false;
    }
    *exit_code = app->exit(e);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> user(argv + 1, argv + argc);
  // A first word that is neither an option nor a command: name it and the commands (CLI11 says
  // only "A subcommand is required").
  static const char* const kCommands[] = {"train", "bench",    "plan",     "generate",
                                          "ckpt",  "tokenize", "export-hf"};
  if (!user.empty() && !user[0].starts_with("-") &&
      std::find(std::begin(kCommands), std::end(kCommands), user[0]) == std::end(kCommands)) {
    fmt::print(stderr,
               "sshsdp: unknown command '{}': use train, bench, plan, generate, ckpt, "
               "tokenize or export-hf (sshsdp --help)\n",
               user[0]);
    return 2;
  }
  std::unique_ptr<Commands> cmd;
  std::unique_ptr<CLI::App> app;
  int rc = 0;
  if (!Parse(cmd, app, user, {}, &rc)) return rc;
  // --model on the command line itself: a --config file or a checkpoint's record may name the
  // default preset next to --model-config (a dumped config lists every option), the command
  // line may not. Later parses rebuild `cmd`, so this is kept here.
  const bool model_given = (cmd->t->parsed() && cmd->t->count("--model") > 0) ||
                           (cmd->p->parsed() && cmd->p->count("--model") > 0) ||
                           (cmd->b->parsed() && cmd->b->count("--model") > 0);
  if (cmd->t->parsed() && (!cmd->train.config.empty() || !cmd->train.resume.empty())) {
    // Precedence: command line > --config > the checkpoint's record > defaults.
    try {
      std::vector<std::string> from_config;
      if (!cmd->train.config.empty()) {
        from_config = sshsdp::ConfigFileArgs(*cmd->t, cmd->train.config);
        const std::string source = "--config " + cmd->train.config;
        if (!Parse(cmd, app, user, from_config, &rc, source)) return rc;
      }
      if (!cmd->train.resume.empty()) {
        const std::string resumed = sshsdp::ResolveCheckpoint(cmd->train.resume);
        const sshsdp::Manifest m = sshsdp::ReadManifest(resumed);
        const auto it = m.meta.run.find("config");
        std::vector<std::string> restored;
        if (it != m.meta.run.end() && it->is_string())
          restored = sshsdp::RestoredArgs(*cmd->t, it->get<std::string>(), resumed);
        std::vector<std::string> prefix = restored;
        prefix.insert(prefix.end(), from_config.begin(), from_config.end());
        if (!Parse(cmd, app, user, prefix, &rc,
                   "the options restored from " + resumed +
                       (from_config.empty() ? "" : " and --config " + cmd->train.config)))
          return rc;
        cmd->train.resumed_model = m.meta.model;
        // The progress note names the restored options that are not at their defaults.
        for (const std::string& a : restored) {
          const size_t eq = a.find('=');
          const CLI::Option* opt = cmd->t->get_option(a.substr(0, eq));
          const std::string value = a.substr(eq + 1), def = opt->get_default_str();
          if (a.rfind("--ckpt-dir=", 0) == 0)
            cmd->train.restored.push_back(a + " (where the resumed checkpoint lies)");
          else if (value != def && !(def.empty() && value == "false"))
            cmd->train.restored.push_back(a);
        }
      }
    } catch (const sshsdp::Error& e) {
      fmt::print(stderr, "sshsdp train: error: {}\n", e.what());
      return 1;
    }
  }
  if (cmd->p->parsed()) {
    if (!cmd->plan.train.config.empty()) {
      try {  // the --config file of the run being planned; the command line wins
        const std::vector<std::string> from_config =
            sshsdp::ConfigFileArgs(*cmd->p, cmd->plan.train.config);
        const std::string source = "--config " + cmd->plan.train.config;
        if (!Parse(cmd, app, user, from_config, &rc, source)) return rc;
      } catch (const sshsdp::Error& e) {
        fmt::print(stderr, "sshsdp plan: error: {}\n", e.what());
        return 1;
      }
    }
    if (cmd->plan.train.dump_config) {  // the planned run's options, for train --config
      fmt::print("{}", sshsdp::RecordedConfig(*cmd->p));
      return 0;
    }
    cmd->plan.train.model_given = model_given;
    return sshsdp::RunPlanCommand(cmd->plan);
  }
  if (cmd->b->parsed()) {
    cmd->bench.recorded_config = sshsdp::RecordedConfig(*cmd->b);
    cmd->bench.model_given = model_given;
    return sshsdp::RunBench(argc, argv, cmd->bench);
  }
  if (cmd->g->parsed()) return sshsdp::RunGenerate(cmd->generate);
  if (cmd->k->parsed()) return sshsdp::RunTokenize(cmd->tokenize);
  if (cmd->x->parsed()) return sshsdp::RunExportHf(cmd->export_hf);
  if (cmd->t->parsed()) {
    CLI::App& t = *cmd->t;
    if (cmd->train.dump_config) {  // a config that train would refuse is not written
      try {
        sshsdp::ValidateEngineConfig(sshsdp::EngineConfigOf(cmd->train, 1, 1));
      } catch (const sshsdp::Error& e) {
        fmt::print(stderr, "sshsdp train: error: {}\n", e.what());
        return 1;
      }
      fmt::print("{}", sshsdp::RecordedConfig(t));
      return 0;
    }
    cmd->train.model_given = model_given;
    cmd->train.layout_given = t.count("--sw") + t.count("--sg") + t.count("--so") > 0;
    cmd->train.ranks_per_node_given = t.count("--ranks-per-node") > 0;
    cmd->train.recorded_config = sshsdp::RecordedConfig(t);
    return sshsdp::RunTrain(argc, argv, cmd->train);
  }
  if (cmd->c->parsed()) return sshsdp::RunCkpt(cmd->ckpt);
  return 0;
}
