// Where the pixels of an op chain's output come from: the affine map from the
// coordinates of the decoded image to those of the output, and the output
// size. Coordinates are pixel edges: (0, 0) is the top-left corner of the
// top-left pixel, (w, h) the bottom-right corner of the last one, so that a
// box [x0, x1) of an image maps to the same pixels after a resize.
//
// Every op moves it as it moves the canvas (OpContext in image_ops.h): crops
// translate, resizes scale, flips mirror. It is what targets that follow an
// image need (boxes and keypoints mapped through it; masks take the same ops
// with nearest-neighbour pixels) and what an op can report; the pixels
// themselves never read it.
#pragma once

#include <utility>

namespace stoker {

struct Geometry {
  // x' = xx * x + xy * y + x0;  y' = yx * x + yy * y + y0
  double xx = 1, xy = 0, x0 = 0;
  double yx = 0, yy = 1, y0 = 0;
  int width = 0, height = 0;  ///< of the output so far

  /// The identity on a (w x h) image.
  static Geometry identity(int w, int h) {
    Geometry g;
    g.width = w;
    g.height = h;
    return g;
  }

  /// Where the point (x, y) of the source lands in the output.
  std::pair<double, double> map(double x, double y) const {
    return {xx * x + xy * y + x0, yx * x + yy * y + y0};
  }

  /// Then a crop of the output to the rectangle at (x, y) of size (w, h) (which
  /// may reach past the edges: what lies outside is padding).
  void crop(int x, int y, int w, int h) {
    x0 -= x;
    y0 -= y;
    width = w;
    height = h;
  }
  /// Then a resize of the output to (w x h).
  void resize(int w, int h) {
    const double sx = static_cast<double>(w) / width, sy = static_cast<double>(h) / height;
    xx *= sx, xy *= sx, x0 *= sx;
    yx *= sy, yy *= sy, y0 *= sy;
    width = w;
    height = h;
  }
  /// Then a left-right mirror of the output.
  void flip() { xx = -xx, xy = -xy, x0 = width - x0; }
};

}  // namespace stoker
