// Constants of the exp2/log2 form every backend computes the softmax in:
// exp(x) = exp2(x * log2 e), log(x) = log2(x) * ln 2.
#pragma once

namespace flashattn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace flashattn
