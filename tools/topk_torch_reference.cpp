// topk_torch_reference.cpp: expected indices of torch.topk on CPU (sorted,
// largest) for tie-heavy rows, written as aten's topk_impl_loop computes
// them: libstdc++ std::partial_sort when k * 64 <= n, else std::nth_element
// at k - 1 then std::sort of the first k - 1, over (value, index) pairs
// ordered "NaN first, then larger first". Regenerates
// tests/data/topk_torch.txt, which src/ir/moe_test.c checks kiln.top_k's
// kernel against:
//   g++ -O1 -o /tmp/topk_ref tools/topk_torch_reference.cpp && /tmp/topk_ref > tests/data/topk_torch.txt
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

int main() {
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    auto next = [&]() { rng = rng * 6364136223846793005ull + 1442695040888963407ull; return (unsigned)(rng >> 33); };
    const int ns[] = {2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64, 128, 129, 256, 300};
    const int ks[] = {1, 2, 3, 4, 6, 8, 20};
    std::printf("# n k values... : indices... (torch.topk CPU, libstdc++)\n");
    for (int n : ns)
        for (int k : ks) {
            if (k > n) continue;
            for (int rep = 0; rep < 4; rep++) {
                int distinct = rep == 0 ? 1 : rep == 1 ? 2 : rep == 2 ? 3 : 1 + (int)(next() % 8);
                std::vector<float> x(n);
                for (int i = 0; i < n; i++) {
                    x[i] = (float)(next() % distinct);
                    if (rep == 3 && next() % 17 == 0) x[i] = NAN;
                }
                using elem = std::pair<float, int64_t>;
                std::vector<elem> q(n);
                for (int i = 0; i < n; i++) q[i] = {x[i], i};
                auto cmp = [](const elem &a, const elem &b) {
                    return (std::isnan(a.first) && !std::isnan(b.first)) || a.first > b.first;
                };
                if ((int64_t)k * 64 <= n) {
                    std::partial_sort(q.begin(), q.begin() + k, q.end(), cmp);
                } else {
                    std::nth_element(q.begin(), q.begin() + k - 1, q.end(), cmp);
                    std::sort(q.begin(), q.begin() + k - 1, cmp);
                }
                std::printf("%d %d", n, k);
                for (float v : x) std::isnan(v) ? std::printf(" nan") : std::printf(" %g", v);
                std::printf(" :");
                for (int j = 0; j < k; j++) std::printf(" %lld", (long long)q[j].second);
                std::printf("\n");
            }
        }
    return 0;
}
