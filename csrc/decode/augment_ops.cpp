#include "decode/augment_ops.h"

#include <cmath>

#include "common/error.h"
#include "decode/crop_params.h"

namespace stoker {

namespace {

struct Name {
  const char* operator()(const ops::RandomResizedCrop&) const { return "RandomResizedCrop"; }
  const char* operator()(const ops::Resize&) const { return "Resize"; }
  const char* operator()(const ops::CenterCrop&) const { return "CenterCrop"; }
  const char* operator()(const ops::RandomHorizontalFlip&) const { return "RandomHorizontalFlip"; }
  const char* operator()(const ops::Normalize&) const { return "Normalize"; }
  const char* operator()(const aug::RandomCrop&) const { return "RandomCrop"; }
  const char* operator()(const aug::Pad&) const { return "Pad"; }
  const char* operator()(const aug::Letterbox&) const { return "Letterbox"; }
  const char* operator()(const aug::VerticalFlip&) const { return "RandomVerticalFlip"; }
  const char* operator()(const aug::RandomRotation&) const { return "RandomRotation"; }
  const char* operator()(const aug::RandomAffine&) const { return "RandomAffine"; }
  const char* operator()(const aug::RandomPerspective&) const { return "RandomPerspective"; }
  const char* operator()(const aug::ColorJitter&) const { return "ColorJitter"; }
  const char* operator()(const aug::RandomGrayscale&) const { return "RandomGrayscale"; }
  const char* operator()(const aug::HsvJitter&) const { return "HSVJitter"; }
  const char* operator()(const aug::GaussianBlur&) const { return "GaussianBlur"; }
  const char* operator()(const aug::AutoAugment& o) const {
    switch (o.params.policy) {
      case AutoAugmentPolicy::kRandAugment:
        return "RandAugment";
      case AutoAugmentPolicy::kTrivialAugmentWide:
        return "TrivialAugmentWide";
      default:
        return "AutoAugment";
    }
  }
  const char* operator()(const aug::RandomErasing&) const { return "RandomErasing"; }
};

bool probability(double p) { return p >= 0 && p <= 1; }

// The (h, w) an op fixes whatever its input, or nullopt.
std::optional<std::pair<int, int>> fixes(const AugmentOp& op) {
  if (const auto* r = std::get_if<ops::Resize>(&op))
    return r->shorter > 0 ? std::nullopt : std::optional<std::pair<int, int>>({r->h, r->w});
  if (const auto* c = std::get_if<ops::RandomResizedCrop>(&op)) return std::make_pair(c->h, c->w);
  if (const auto* c = std::get_if<ops::CenterCrop>(&op)) return std::make_pair(c->h, c->w);
  if (const auto* c = std::get_if<aug::RandomCrop>(&op)) return std::make_pair(c->h, c->w);
  if (const auto* l = std::get_if<aug::Letterbox>(&op)) return std::make_pair(l->h, l->w);
  return std::nullopt;
}

}  // namespace

const char* augment_op_name(const AugmentOp& op) { return std::visit(Name{}, op); }

OpRole augment_op_role(const AugmentOp& op) {
  if (std::holds_alternative<ops::Normalize>(op) || std::holds_alternative<aug::RandomErasing>(op))
    return OpRole::kOutput;
  if (std::holds_alternative<aug::ColorJitter>(op) ||
      std::holds_alternative<aug::RandomGrayscale>(op) ||
      std::holds_alternative<aug::HsvJitter>(op) || std::holds_alternative<aug::GaussianBlur>(op))
    return OpRole::kColor;
  return OpRole::kGeometry;  // AutoAugment too: it shears, translates and rotates
}

void check_augment_ops(const std::vector<AugmentOp>& list) {
  bool output = false;     // Normalize or RandomErasing seen
  bool open_size = false;  // a rotation with expand=True not yet followed by a fixing op
  for (const AugmentOp& op : list) {
    const char* name = augment_op_name(op);
    const OpRole role = augment_op_role(op);
    if (output && !std::holds_alternative<aug::RandomErasing>(op))
      STOKER_THROW(UsageError, name,
                   " comes after Normalize or RandomErasing: only "
                   "RandomErasing may follow them (they act on the output)");
    if (role == OpRole::kOutput) output = true;
    if (fixes(op)) open_size = false;
    if (const auto* r = std::get_if<aug::RandomRotation>(&op)) {
      STOKER_CHECK(r->lo <= r->hi, UsageError, name, ": degrees must satisfy lo <= hi");
      if (r->expand) {
        STOKER_CHECK(!r->center, UsageError, name, ": expand=True rotates about the centre only");
        open_size = true;
      }
    } else if (const auto* a = std::get_if<aug::RandomAffine>(&op)) {
      STOKER_CHECK(a->deg_lo <= a->deg_hi, UsageError, name, ": degrees must satisfy lo <= hi");
      if (a->translate)
        for (double t : *a->translate)
          STOKER_CHECK(t >= 0 && t <= 1, UsageError, name, ": translate must be in [0, 1]");
      if (a->scale)
        STOKER_CHECK((*a->scale)[0] > 0 && (*a->scale)[0] <= (*a->scale)[1], UsageError, name,
                     ": scale must satisfy 0 < lo <= hi");
      if (a->shear)
        STOKER_CHECK((*a->shear)[0] <= (*a->shear)[1] && (*a->shear)[2] <= (*a->shear)[3],
                     UsageError, name, ": shear ranges must satisfy lo <= hi");
    } else if (const auto* p = std::get_if<aug::RandomPerspective>(&op)) {
      STOKER_CHECK(p->distortion >= 0 && p->distortion <= 1 && probability(p->p), UsageError, name,
                   ": distortion_scale and p must be in [0, 1]");
    } else if (const auto* g = std::get_if<aug::GaussianBlur>(&op)) {
      STOKER_CHECK(g->kx > 0 && g->ky > 0 && g->kx % 2 == 1 && g->ky % 2 == 1, UsageError, name,
                   ": kernel_size must be odd and positive");
      STOKER_CHECK(g->sigma_lo > 0 && g->sigma_lo <= g->sigma_hi, UsageError, name,
                   ": sigma must satisfy 0 < lo <= hi");
    } else if (const auto* j = std::get_if<aug::ColorJitter>(&op)) {
      for (const auto* r : {&j->brightness, &j->contrast, &j->saturation})
        if (*r)
          STOKER_CHECK((**r)[0] >= 0 && (**r)[0] <= (**r)[1], UsageError, name,
                       ": brightness, contrast and saturation need 0 <= lo <= hi");
      if (j->hue)
        STOKER_CHECK((*j->hue)[0] >= -0.5 && (*j->hue)[0] <= (*j->hue)[1] && (*j->hue)[1] <= 0.5,
                     UsageError, name, ": hue needs -0.5 <= lo <= hi <= 0.5");
    } else if (const auto* hj = std::get_if<aug::HsvJitter>(&op)) {
      STOKER_CHECK(hj->h >= 0 && hj->h <= 1 && hj->s >= 0 && hj->s <= 1 && hj->v >= 0 && hj->v <= 1,
                   UsageError, name, ": gains must be in [0, 1]");
    } else if (const auto* gs = std::get_if<aug::RandomGrayscale>(&op)) {
      STOKER_CHECK(probability(gs->p), UsageError, name, ": p must be in [0, 1]");
    } else if (const auto* v = std::get_if<aug::VerticalFlip>(&op)) {
      STOKER_CHECK(probability(v->p), UsageError, name, ": p must be in [0, 1]");
    } else if (const auto* e = std::get_if<aug::RandomErasing>(&op)) {
      const ErasingParams& q = e->params;
      STOKER_CHECK(probability(q.p) && q.scale_lo >= 0 && q.scale_lo <= q.scale_hi &&
                       q.scale_hi <= 1 && q.log_ratio_lo <= q.log_ratio_hi,
                   UsageError, name, ": p in [0, 1], 0 <= scale lo <= hi <= 1, ratio lo <= hi");
    } else if (const auto* aa = std::get_if<aug::AutoAugment>(&op)) {
      const AutoAugmentParams& q = aa->params;
      STOKER_CHECK(q.num_ops >= 0 && q.num_ops <= kMaxAugOps, UsageError, name,
                   ": num_ops must be in [0, ", kMaxAugOps, "]");
      STOKER_CHECK(
          q.num_magnitude_bins >= 2 && q.magnitude >= 0 && q.magnitude < q.num_magnitude_bins,
          UsageError, name, ": magnitude must be in [0, num_magnitude_bins)");
    } else if (const auto* c = std::get_if<aug::RandomCrop>(&op)) {
      STOKER_CHECK(c->h > 0 && c->w > 0 && c->pad_left >= 0 && c->pad_top >= 0 &&
                       c->pad_right >= 0 && c->pad_bottom >= 0,
                   UsageError, name, ": size must be positive and padding non-negative");
    } else if (const auto* pd = std::get_if<aug::Pad>(&op)) {
      STOKER_CHECK(pd->left >= 0 && pd->top >= 0 && pd->right >= 0 && pd->bottom >= 0, UsageError,
                   name, ": padding must be non-negative");
    } else if (const auto* l = std::get_if<aug::Letterbox>(&op)) {
      STOKER_CHECK(l->h > 0 && l->w > 0, UsageError, name, ": size must be positive");
    }
  }
  STOKER_CHECK(!open_size, UsageError,
               "RandomRotation(expand=True) gives every image its own size: follow it with an "
               "op that fixes the size (Resize((h, w)), CenterCrop, RandomResizedCrop, "
               "RandomCrop or Letterbox) so that images can be batched");
}

std::optional<std::pair<int, int>> augment_size_after(const AugmentOp& op, std::pair<int, int> hw) {
  if (const auto* r = std::get_if<ops::Resize>(&op)) return r->size_after(hw);
  if (auto f = fixes(op)) return f;
  if (const auto* p = std::get_if<aug::Pad>(&op))
    return std::make_pair(hw.first + p->top + p->bottom, hw.second + p->left + p->right);
  if (const auto* r = std::get_if<aug::RandomRotation>(&op))
    if (r->expand) return std::nullopt;
  return hw;
}

std::optional<std::pair<int, int>> augment_fixed_size(const AugmentOp& op) { return fixes(op); }

LetterboxFit letterbox_fit(const aug::Letterbox& op, int w, int h) {
  // ultralytics' LetterBox: r = min(H / h, W / w) (<= 1 without scaleup), the
  // resized size rounded, the rest split with the extra pixel at the end.
  double r = std::min(static_cast<double>(op.h) / h, static_cast<double>(op.w) / w);
  if (!op.scaleup) r = std::min(r, 1.0);
  LetterboxFit f;
  f.w = std::max(1, static_cast<int>(std::nearbyint(w * r)));
  f.h = std::max(1, static_cast<int>(std::nearbyint(h * r)));
  f.w = std::min(f.w, op.w);
  f.h = std::min(f.h, op.h);
  f.left = (op.w - f.w) / 2;
  f.top = (op.h - f.h) / 2;
  return f;
}

}  // namespace stoker
