#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "hack/core/error.h"
#include "hack/model/sampler.h"

using namespace hack;
using Catch::Contains;

namespace {

std::vector<float> random_logits(int vocab, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) x = n(rng);
  return v;
}

SamplingParams params_with_seed(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  p.max_tokens = 1000000;
  return p;
}

// Samples `n` tokens from the same logits (penalties off, so draws are i.i.d.).
std::vector<int> histogram(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p, static_cast<int>(logits.size()));
  std::vector<int> counts(logits.size(), 0);
  std::vector<float> scratch;
  for (int i = 0; i < n; ++i) {
    scratch = logits;
    ++counts[static_cast<size_t>(s.sample(scratch).token)];
  }
  return counts;
}

// softmax(logits / t) in double, the reference distribution.
std::vector<double> softmax(const std::vector<float>& logits, double t = 1.0) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - mx) / t);
  for (double& x : p) x /= sum;
  return p;
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0) {
      REQUIRE(counts[i] == 0);
      continue;
    }
    const double e = probs[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

}  // namespace

TEST_CASE("sampler: temperature 0 is argmax, ties to the lowest id", "[model][sampler]") {
  SamplingParams p;
  p.temperature = 0.0f;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<float> logits = random_logits(1000, seed);
    const int expect = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    Sampler s(p, 1000);
    CHECK(s.sample(logits).token == expect);
  }
  std::vector<float> ties = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  Sampler s(p, 5);
  CHECK(s.sample(ties).token == 1);
  std::vector<float> neg_inf(5, -std::numeric_limits<float>::infinity());
  neg_inf[4] = -1e30f;
  CHECK(Sampler(p, 5).sample(neg_inf).token == 4);
}

TEST_CASE("sampler: a seed reproduces the sequence, other seeds differ", "[model][sampler]") {
  const std::vector<float> logits = random_logits(500, 1, 1.0f);
  SamplingParams p = params_with_seed(1234);
  p.top_p = 0.95f;
  p.top_k = 200;
  auto run = [&](const SamplingParams& params) {
    Sampler s(params, 500);
    std::vector<int> out;
    for (int i = 0; i < 200; ++i) {
      std::vector<float> l = logits;
      out.push_back(s.sample(l).token);
    }
    return out;
  };
  const std::vector<int> a = run(p);
  CHECK(run(p) == a);
  SamplingParams q = p;
  q.seed = 1235;
  CHECK(run(q) != a);
  CHECK(std::set<int>(a.begin(), a.end()).size() > 20);  // it really is random
  SamplingParams unseeded = p;
  unseeded.seed.reset();
  CHECK(run(unseeded) != a);  // P(equal) ~ 0
}

TEST_CASE("sampler: top_k = 1 and a tiny top_p are greedy", "[model][sampler]") {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const std::vector<float> logits = random_logits(3000, seed, 1.0f);
    const int argmax = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    SamplingParams k1 = params_with_seed(seed);
    k1.top_k = 1;
    SamplingParams p0 = params_with_seed(seed);
    p0.top_p = 1e-6f;
    SamplingParams minp = params_with_seed(seed);
    minp.min_p = 1.0f;
    for (const SamplingParams& p : {k1, p0, minp}) {
      Sampler s(p, 3000);
      for (int i = 0; i < 20; ++i) {
        std::vector<float> l = logits;
        REQUIRE(s.sample(l).token == argmax);
      }
    }
  }
}

TEST_CASE("sampler: temperature matches softmax(logits / T) (chi-square)", "[model][sampler]") {
  // 12 tokens, 20k draws, fixed seed. The 0.9999 quantile of chi-square with 11 degrees of
  // freedom is ~35.5; a wrong temperature (or none) gives values in the hundreds.
  const std::vector<float> logits = {0.3f, -1.0f, 2.0f, 1.1f, 0.0f, -0.5f, 1.7f, 0.9f, -2.0f, 0.4f, 1.2f, -0.1f};
  const int n = 20000;
  for (float t : {0.5f, 1.0f, 2.0f}) {
    SamplingParams p = params_with_seed(99);
    p.temperature = t;
    const std::vector<int> counts = histogram(p, logits, n);
    const double chi2 = chi_square(counts, softmax(logits, t), n);
    INFO("temperature " << t << " chi2 " << chi2);
    CHECK(chi2 < 35.5);
    // The same draws against the wrong temperature must fail the bound.
    const double wrong = chi_square(counts, softmax(logits, t * 1.5), n);
    INFO("wrong-temperature chi2 " << wrong);
    CHECK(wrong > 35.5);
  }
}

TEST_CASE("sampler: top-k, top-p and min-p keep the right tokens", "[model][sampler]") {
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  const std::vector<float> logits = logits_of(probs);
  const int n = 20000;

  SECTION("top_k = 2 renormalises over the best two") {
    SamplingParams p = params_with_seed(5);
    p.top_k = 2;
    const auto counts = histogram(p, logits, n);
    CHECK(chi_square(counts, {0.5 / 0.8, 0.3 / 0.8, 0, 0}, n) < 15.1);  // df 1, p = 1e-4
  }
  SECTION("top_p includes the token that crosses p") {
    SamplingParams p = params_with_seed(6);
    p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.8: tokens 0 and 1
    auto counts = histogram(p, logits, n);
    CHECK(chi_square(counts, {0.5 / 0.8, 0.3 / 0.8, 0, 0}, n) < 15.1);
    p.top_p = 0.85f;  // 0.8 < 0.85 <= 0.95: tokens 0, 1, 2
    counts = histogram(p, logits, n);
    CHECK(chi_square(counts, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, n) < 18.5);
    p.top_p = 0.4f;  // the first token alone crosses it
    counts = histogram(p, logits, n);
    CHECK(counts[0] == n);
  }
  SECTION("top_p applies to the top_k-renormalised distribution") {
    SamplingParams p = params_with_seed(7);
    p.top_k = 2;
    p.top_p = 0.6f;  // top-2 renormalised: 0.625, 0.375 -> token 0 alone crosses 0.6
    CHECK(histogram(p, logits, 2000)[0] == 2000);
  }
  SECTION("min_p keeps p >= min_p * p_max") {
    SamplingParams p = params_with_seed(8);
    p.min_p = 0.2f;  // threshold 0.1: tokens 0, 1, 2
    auto counts = histogram(p, logits, n);
    CHECK(chi_square(counts, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, n) < 18.5);
    p.min_p = 0.7f;  // threshold 0.35: token 0
    counts = histogram(p, logits, 2000);
    CHECK(counts[0] == 2000);
  }
}

TEST_CASE("sampler: -inf logits are never drawn, top_k >= vocab is off", "[model][sampler]") {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {kNegInf, 0.0f, kNegInf, 0.0f, kNegInf};
  for (int top_k : {0, 2, 3, 5, 9}) {
    for (float top_p : {1.0f, 0.99f}) {
      SamplingParams p = params_with_seed(12);
      p.top_k = top_k;
      p.top_p = top_p;
      const auto counts = histogram(p, logits, 4000);
      INFO("top_k " << top_k << " top_p " << top_p);
      CHECK(counts[0] + counts[2] + counts[4] == 0);
      CHECK(counts[1] > 1800);
      CHECK(counts[3] > 1800);
    }
  }
  // top_k larger than the vocabulary is the same as no top_k: same draws for a seed.
  const std::vector<float> l = random_logits(50, 8, 1.0f);
  SamplingParams a = params_with_seed(77);
  SamplingParams b = a;
  b.top_k = 50;
  CHECK(histogram(a, l, 500) == histogram(b, l, 500));
}

TEST_CASE("sampler: top-p on a large vocabulary equals the sorted-reference nucleus", "[model][sampler]") {
  // Flat-ish logits so the nucleus holds thousands of tokens (the slow path: the sampler has
  // to extend its sorted prefix several times).
  const int vocab = 20000;
  for (float scale : {0.5f, 2.0f, 6.0f}) {
    const std::vector<float> logits = random_logits(vocab, 17, scale);
    for (float top_p : {0.3f, 0.9f}) {
      for (int top_k : {0, 300, 5000}) {  // 5000: past the heap, nth_element
        // Reference: full sort, renormalise over top_k, keep through the crossing token.
        std::vector<int> order(vocab);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
        const size_t k = top_k > 0 ? static_cast<size_t>(top_k) : order.size();
        const double mx = logits[order[0]];
        double total = 0;
        for (size_t i = 0; i < k; ++i) total += std::exp(logits[order[i]] - mx);
        std::set<int> nucleus;
        double cum = 0;
        for (size_t i = 0; i < k; ++i) {
          nucleus.insert(order[i]);
          cum += std::exp(logits[order[i]] - mx);
          if (cum >= top_p * total) break;
        }
        SamplingParams p = params_with_seed(3);
        p.top_p = top_p;
        p.top_k = top_k;
        const auto counts = histogram(p, logits, 500);
        std::set<int> seen;
        for (int t = 0; t < vocab; ++t) {
          if (counts[static_cast<size_t>(t)] > 0) seen.insert(t);
        }
        INFO("scale " << scale << " top_p " << top_p << " top_k " << top_k << " nucleus " << nucleus.size());
        // Every sampled token is in the nucleus (a boundary token may differ only through
        // rounding of the cumulative sum, far below these margins).
        for (int t : seen) CHECK(nucleus.count(t) == 1);
        if (nucleus.size() <= 20) CHECK(seen.size() == nucleus.size());
      }
    }
  }
}

TEST_CASE("sampler: penalties change the logits as specified", "[model][sampler]") {
  SECTION("repetition penalty (HF): over prompt and output, divide positive, multiply negative") {
    SamplingParams p;
    p.temperature = 0.0f;
    p.repetition_penalty = 2.0f;
    Sampler s(p, 5);
    s.add_prompt_tokens(std::vector<int>{0, 1, 1});
    std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f, -1.0f};
    CHECK(s.sample(l).token == 0);  // 1 (=2/2) ties with token 2; lowest id wins
    CHECK(l == std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f, -1.0f});
    // Output token 0 counted now too (once, however often it appears).
    std::vector<float> l2 = {2.0f, -2.0f, 1.0f, 0.5f, -1.0f};
    s.sample(l2);
    CHECK(l2 == std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f, -1.0f});
  }
  SECTION("frequency and presence (OpenAI): output tokens only") {
    SamplingParams p;
    p.temperature = 0.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    Sampler s(p, 4);
    s.add_prompt_tokens(std::vector<int>{3});  // prompt tokens are not penalised
    std::vector<float> l = {5.0f, 0.0f, 0.0f, 1.0f};
    CHECK(s.sample(l).token == 0);
    CHECK(l == std::vector<float>{5.0f, 0.0f, 0.0f, 1.0f});
    l = {5.0f, 0.0f, 0.0f, 1.0f};
    CHECK(s.sample(l).token == 0);
    CHECK(l[0] == 5.0f - 0.5f - 0.25f);
    l = {5.0f, 0.0f, 0.0f, 1.0f};
    CHECK(s.sample(l).token == 0);
    CHECK(l[0] == 5.0f - 2 * 0.5f - 0.25f);
    CHECK(l[3] == 1.0f);
  }
  SECTION("penalties steer sampling away from repeats") {
    SamplingParams p = params_with_seed(4);
    p.temperature = 0.0f;
    p.presence_penalty = 2.0f;
    Sampler s(p, 3);
    std::vector<int> out;
    for (int i = 0; i < 3; ++i) {
      std::vector<float> l = {1.0f, 0.5f, 0.0f};
      out.push_back(s.sample(l).token);
    }
    CHECK(out == std::vector<int>{0, 1, 2});
  }
}

TEST_CASE("sampler: logprobs are the raw log-softmax, top logprobs sorted", "[model][sampler]") {
  const int vocab = 2000;
  const std::vector<float> logits = random_logits(vocab, 21, 2.0f);
  const std::vector<double> ref = softmax(logits);
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });

  SamplingParams p = params_with_seed(2);
  p.logprobs = 5;
  p.temperature = 0.7f;         // neither temperature...
  p.repetition_penalty = 1.3f;  // ...nor penalties change reported logprobs
  p.frequency_penalty = 0.4f;
  Sampler s(p, vocab);
  s.add_prompt_tokens(std::vector<int>{order[0], order[1]});
  for (int step = 0; step < 5; ++step) {
    std::vector<float> l = logits;
    const SampleResult r = s.sample(l);
    CHECK(r.logprob == Approx(std::log(ref[static_cast<size_t>(r.token)])).margin(1e-5));
    REQUIRE(r.top_logprobs.size() == 5);
    for (size_t i = 0; i < 5; ++i) {
      CHECK(r.top_logprobs[i].token == order[i]);
      CHECK(r.top_logprobs[i].logprob == Approx(std::log(ref[static_cast<size_t>(order[i])])).margin(1e-5));
      if (i) CHECK(r.top_logprobs[i].logprob <= r.top_logprobs[i - 1].logprob);
    }
  }

  SamplingParams zero;
  zero.temperature = 0.0f;
  zero.logprobs = 0;
  std::vector<float> l = logits;
  const SampleResult r = Sampler(zero, vocab).sample(l);
  CHECK(r.token == order[0]);
  CHECK(r.logprob == Approx(std::log(ref[static_cast<size_t>(order[0])])).margin(1e-5));
  CHECK(r.top_logprobs.empty());
}

TEST_CASE("sampler: stop tokens and EOS", "[model][sampler]") {
  SamplingParams p;
  p.stop_token_ids = {7, 9};
  const std::vector<int> eos = {2, 3};
  Sampler s(p, 10);
  CHECK(s.is_stop_token(7, eos));
  CHECK(s.is_stop_token(2, eos));
  CHECK_FALSE(s.is_stop_token(5, eos));
  p.ignore_eos = true;
  Sampler ignoring(p, 10);
  CHECK_FALSE(ignoring.is_stop_token(2, eos));
  CHECK(ignoring.is_stop_token(9, eos));
}

TEST_CASE("sampler: bad input is rejected", "[model][sampler]") {
  SamplingParams p;
  p.temperature = 1.0f;
  Sampler s(p, 4);
  std::vector<float> nan = {0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f, 0.0f};
  REQUIRE_THROWS_WITH(s.sample(nan), Contains("NaN"));
  std::vector<float> inf(4, -std::numeric_limits<float>::infinity());
  REQUIRE_THROWS_WITH(s.sample(inf), Contains("-inf"));
  std::vector<float> short_logits(3, 0.0f);
  REQUIRE_THROWS_WITH(s.sample(short_logits), Contains("3 logits") && Contains("vocabulary of 4"));
  REQUIRE_THROWS_WITH(s.add_prompt_tokens(std::vector<int>{4}), Contains("token 4"));
}

TEST_CASE("SamplingParams::validate names the field", "[model][sampler]") {
  auto check = [](auto mutate, const std::string& message) {
    SamplingParams p;
    mutate(p);
    INFO(message);
    REQUIRE_THROWS_WITH(p.validate(100), Contains(message));
    REQUIRE_THROWS_AS(Sampler(p, 100), Error);
  };
  check([](SamplingParams& p) { p.temperature = -1.0f; }, "temperature must be >= 0, got -1");
  check([](SamplingParams& p) { p.temperature = std::numeric_limits<float>::quiet_NaN(); }, "temperature");
  check([](SamplingParams& p) { p.top_k = -2; }, "top_k must be >= 0");
  check([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p must be in (0, 1], got 0");
  check([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be in (0, 1], got 1.5");
  check([](SamplingParams& p) { p.min_p = -0.1f; }, "min_p must be in [0, 1]");
  check([](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty must be in [-2, 2], got 2.5");
  check([](SamplingParams& p) { p.frequency_penalty = -3.0f; }, "frequency_penalty must be in [-2, 2], got -3");
  check([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty must be > 0, got 0");
  check([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens must be >= 1, got 0");
  check([](SamplingParams& p) { p.stop_token_ids = {5, 100}; }, "stop_token_ids: token 100");
  check([](SamplingParams& p) { p.min_tokens = 17; }, "min_tokens must be in [0, max_tokens = 16], got 17");
  check([](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens");
  check([](SamplingParams& p) { p.logprobs = -2; }, "logprobs must be in [-1, 100], got -2");

  SamplingParams ok;
  ok.top_k = -1;  // vLLM clients' "off"
  ok.temperature = 0.0f;
  ok.logprobs = 20;
  CHECK_NOTHROW(ok.validate(100));
  REQUIRE_THROWS_WITH(ok.validate(0), Contains("vocab_size must be > 0"));
}

TEST_CASE("sampler: a second sampler continues a sequence after record_token", "[model][sampler]") {
  // Process A samples tokens 0..9; process B learns token 0 from A (the prefill node's first
  // token), records it and samples 1..9 from the same logits: same tokens, since every draw
  // is a function of (seed, step) and the penalties see the same history.
  const int vocab = 300;
  std::vector<std::vector<float>> logits;
  for (uint64_t i = 0; i < 10; ++i) logits.push_back(random_logits(vocab, 100 + i, 1.0f));
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.presence_penalty = 0.7f;
  p.repetition_penalty = 1.2f;
  p.max_tokens = 10;
  const std::vector<int> prompt = {3, 5, 7};
  for (const bool seeded : {true, false}) {
    INFO("seeded " << seeded);
    SamplingParams pa = p;
    if (seeded) pa.seed = 424242;
    Sampler a(pa, vocab);
    a.add_prompt_tokens(prompt);
    std::vector<int> from_a;
    for (int i = 0; i < 10; ++i) {
      std::vector<float> l = logits[static_cast<size_t>(i)];
      from_a.push_back(a.sample(l).token);
    }
    if (seeded) CHECK(a.seed() == 424242);
    CHECK(a.step() == 10);
    CHECK(std::set<int>(from_a.begin(), from_a.end()).size() > 3);  // really sampled

    SamplingParams pb = p;
    pb.seed = a.seed();
    Sampler b(pb, vocab);
    b.add_prompt_tokens(prompt);
    b.record_token(from_a[0]);
    CHECK(b.step() == 1);
    std::vector<int> from_b = {from_a[0]};
    for (int i = 1; i < 10; ++i) {
      std::vector<float> l = logits[static_cast<size_t>(i)];
      from_b.push_back(b.sample(l).token);
    }
    CHECK(from_b == from_a);

    // Without the recorded token, B draws step 0's number for token 1: a different stream.
    Sampler c(pb, vocab);
    c.add_prompt_tokens(prompt);
    std::vector<int> from_c = {from_a[0]};
    for (int i = 1; i < 10; ++i) {
      std::vector<float> l = logits[static_cast<size_t>(i)];
      from_c.push_back(c.sample(l).token);
    }
    CHECK(from_c != from_a);
  }
  // Unseeded samplers pick different seeds.
  CHECK(Sampler(p, vocab).seed() != Sampler(p, vocab).seed());
  REQUIRE_THROWS_WITH(Sampler(p, vocab).record_token(vocab), Contains("outside the vocabulary"));
}

TEST_CASE("sampler: the per-step uniform is a function of (seed, step) and looks uniform", "[model][sampler]") {
  CHECK(uniform_for_step(7, 3) == uniform_for_step(7, 3));
  CHECK(uniform_for_step(7, 3) != uniform_for_step(7, 4));
  CHECK(uniform_for_step(7, 3) != uniform_for_step(8, 3));
  // 16 equal bins over 64k consecutive steps: chi-square with 15 degrees of freedom, whose
  // 0.9999 quantile is ~44.3.
  std::vector<int> bins(16, 0);
  const int n = 1 << 16;
  for (int i = 0; i < n; ++i) {
    const double u = uniform_for_step(12345, static_cast<uint64_t>(i));
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    ++bins[static_cast<size_t>(u * 16)];
  }
  double chi2 = 0;
  for (int b : bins) chi2 += (b - n / 16.0) * (b - n / 16.0) / (n / 16.0);
  INFO("chi2 " << chi2);
  CHECK(chi2 < 44.3);
}

TEST_CASE("min_tokens holds back EOS and stop tokens until enough are generated", "[sampler]") {
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {3};
  const std::vector<int> eos = {1, 99};  // 99 lies outside the row: ignored
  std::vector<float> row(5, 0.5f);
  suppress_ending_tokens(row, p, eos, 1);
  REQUIRE(row == std::vector<float>{0.5f, -INFINITY, 0.5f, -INFINITY, 0.5f});
  std::vector<float> later(5, 0.5f);
  suppress_ending_tokens(later, p, eos, 2);
  REQUIRE(later == std::vector<float>(5, 0.5f));
}

TEST_CASE("logit_bias moves the chosen token, and logprobs report the biased distribution", "[sampler]") {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 0;
  Sampler plain(p, 4);
  std::vector<float> a = logits;
  const SampleResult unbiased = plain.sample(a);
  REQUIRE(unbiased.token == 1);
  p.logit_bias = {{1, -100.0f}, {3, 2.0f}};  // 1 banned in effect, 3 raised to 2.5
  Sampler biased(p, 4);
  std::vector<float> b = logits;
  const SampleResult r = biased.sample(b);
  REQUIRE(r.token == 3);
  // The logprob reported is log-softmax of the biased logits (OpenAI's convention).
  const double lse = std::log(std::exp(1.0) + std::exp(3.0 - 100.0) + std::exp(2.0) + std::exp(2.5));
  REQUIRE(std::fabs(r.logprob - (2.5 - lse)) < 1e-5);
  // Sampling with temperature: a +100 bias makes the token certain.
  SamplingParams q;
  q.temperature = 1.0f;
  q.seed = 3;
  q.logit_bias = {{0, 100.0f}};
  Sampler forced(q, 4);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> c = logits;
    REQUIRE(forced.sample(c).token == 0);
  }
  SamplingParams bad;
  bad.logit_bias = {{4, 1.0f}};
  REQUIRE_THROWS_AS(bad.validate(4), Error);
  bad.logit_bias = {{1, 100.5f}};
  REQUIRE_THROWS_AS(bad.validate(4), Error);
}

TEST_CASE("prompt_logprobs: each token under the row before it, top k best first, first token skipped",
          "[model][sampler]") {
  constexpr int kVocab = 37;
  const std::vector<int> tokens = {3, 36, 0, 3, 17};
  std::vector<float> logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float> row = random_logits(kVocab, 100 + i);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  logits[2 * kVocab + 5] = logits[2 * kVocab + 6] = 50.0f;  // a tie at the top of row 2: lower id first
  const std::vector<SampleResult> lps = prompt_logprobs(logits, tokens, kVocab, 3);
  REQUIRE(lps.size() == tokens.size() - 1);
  for (size_t i = 1; i < tokens.size(); ++i) {
    // Reference: softmax in long double, top 3 by a full sort.
    const float* row = logits.data() + (i - 1) * kVocab;
    long double z = 0;
    for (int t = 0; t < kVocab; ++t) z += std::exp(static_cast<long double>(row[t]));
    auto lp = [&](int t) { return static_cast<double>(std::log(std::exp(static_cast<long double>(row[t])) / z)); };
    std::vector<int> order(kVocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
    const SampleResult& r = lps[i - 1];
    CHECK(r.token == tokens[i]);
    // float32 logits with a double log-sum-exp: within 1e-5 of the long-double value.
    CHECK(std::abs(r.logprob - lp(tokens[i])) <= 1e-5);
    REQUIRE(r.top_logprobs.size() == 3);
    for (int j = 0; j < 3; ++j) {
      CHECK(r.top_logprobs[j].token == order[j]);
      CHECK(std::abs(r.top_logprobs[j].logprob - lp(order[j])) <= 1e-5);
    }
  }
  CHECK(lps[2].top_logprobs[0].token == 5);
  CHECK(lps[2].top_logprobs[1].token == 6);
  CHECK(prompt_logprobs(logits, tokens, kVocab, 0)[0].top_logprobs.empty());
  CHECK(prompt_logprobs(std::span<const float>(logits).first(kVocab), std::span<const int>(tokens).first(1), kVocab, 2)
            .empty());
  CHECK_THROWS_AS(prompt_logprobs(logits, std::span<const int>(tokens).first(2), kVocab, 0), Error);
}
