#include "examples/gpt/progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace gpt {

ProgressBar::ProgressBar(int first_step, int total_steps, int every)
    : first_(first_step), total_(total_steps), every_(every < 1 ? 1 : every), tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

double ProgressBar::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double ProgressBar::tokens_per_s(double tokens) const {
  const double t = elapsed_s();
  return t > 0 ? tokens / t : 0.0;
}

void ProgressBar::update(int step, double loss, double lr, double tokens) {
  if (!tty_ && step % every_ != 0 && step != total_) return;
  const double t = elapsed_s();
  const double eta = step > first_ ? t / (step - first_) * (total_ - step) : 0.0;
  constexpr int kWidth = 24;
  const int filled = total_ > 0 ? kWidth * step / total_ : kWidth;
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
  bar[kWidth] = 0;
  std::fprintf(stderr, "%s[%s] %d/%d loss %.4f lr %.2e %.0f tok/s elapsed %.0fs ETA %.0fs%s",
               tty_ ? "\r" : "", bar, step, total_, loss, lr, tokens_per_s(tokens), t, eta,
               tty_ ? "\033[K" : "\n");
  std::fflush(stderr);
  drawn_ = tty_;
}

void ProgressBar::message(const std::string& text) {
  std::fprintf(stderr, "%s%s\n", drawn_ ? "\r\033[K" : "", text.c_str());
  std::fflush(stderr);
  drawn_ = false;
}

void ProgressBar::finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace gpt
