;; Compute kernels of the CPU reference model: bf16 weights widened to f32 in-kernel, wasm SIMD
;; (no relaxed SIMD). Knows pointers, shapes and ONE summation order; the model (TypeScript)
;; decides what to call with which buffers, and splits work between threads by rows only.
;;
;; Weight image of a [rows][cols] matrix ("4-row interleaved"): rows go in groups of 4; a group
;; holds, for each block of 8 columns in order, the 8 bf16 of row 0, then row 1, 2, 3 (64 bytes).
;; The rows % 4 tail rows follow the last group as plain rows. Row r < 4*floor(rows/4) lives in
;; the group at w + r*cols*2 (r a multiple of 4). One pointer walks all four rows.
;;
;; The summation order of every dot product (all tile shapes, any token count, any thread split):
;;   8 bf16 are read as one v128 = four i32 lanes, lane j = (w[2j+1] << 16) | w[2j].
;;   `i32x4.shl 16` gives the f32 of the even weights, `v128.and 0xffff0000` the odd ones (bf16 is
;;   the top half of an f32, so widening is exact). Inputs are packed to match (see pack_x):
;;   each block of 8 as [x0 x2 x4 x6 | x1 x3 x5 x7].
;;   Per output:  acc = 0;  for each block of 8 columns, in order: acc += even*xe;  acc += odd*xo
;;   then result = (acc[0] + acc[1]) + (acc[2] + acc[3]).
;;   Every tile below repeats exactly these operations per output, so a row computed alone, in a
;;   group of 4 rows, or in a 4-token x 2-row tile gives the same bits.
;; Attention scores sum over head_dim in increasing d, values over positions in increasing s.
;; Columns must be a multiple of 8; head_dim a multiple of 4.

(module
  (import "env" "memory" (memory 1 65536 shared))

  ;; ---------------------------------------------------------------- horizontal sum, fixed order
  (func $hsum (param $a v128) (result f32)
    (f32.add
      (f32.add (f32x4.extract_lane 0 (local.get $a)) (f32x4.extract_lane 1 (local.get $a)))
      (f32.add (f32x4.extract_lane 2 (local.get $a)) (f32x4.extract_lane 3 (local.get $a)))))

  ;; ---------------------------------------------------------------- one row x one token
  ;; y[0] = dot(w[0..cols), x) for one plain row (16 bytes per block) and a permuted x row.
  (func $mv_1r (param $w i32) (param $x i32) (param $y i32) (param $cols i32)
    (local $acc v128) (local $v v128) (local $end i32)
    (local.set $end (i32.add (local.get $w) (i32.shl (local.get $cols) (i32.const 1))))
    (loop $next
      (local.set $v (v128.load (local.get $w)))
      (local.set $acc (f32x4.add (local.get $acc)
        (f32x4.mul (i32x4.shl (local.get $v) (i32.const 16)) (v128.load (local.get $x)))))
      (local.set $acc (f32x4.add (local.get $acc)
        (f32x4.mul (v128.and (local.get $v) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000))
                   (v128.load offset=16 (local.get $x)))))
      (local.set $x (i32.add (local.get $x) (i32.const 32)))
      (br_if $next (i32.lt_u (local.tee $w (i32.add (local.get $w) (i32.const 16))) (local.get $end))))
    (f32.store (local.get $y) (call $hsum (local.get $acc))))

  ;; ---------------------------------------------------------------- four rows x one token
  ;; $w is a 4-row group (64 bytes per block of 8 columns), $x a permuted row (32 bytes per block).
  ;; Two blocks per trip, then the odd block if cols/8 is odd; blocks are taken in order.
  (func $mv_4r (param $w i32) (param $x i32) (param $y i32) (param $cols i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local $v0 v128) (local $v1 v128) (local $v2 v128) (local $v3 v128)
    (local $xe v128) (local $xo v128) (local $end i32) (local $end2 i32)
    (local.set $end (i32.add (local.get $w) (i32.shl (local.get $cols) (i32.const 3))))
    (local.set $end2 (i32.sub (local.get $end) (i32.const 64)))
    (block $pairs_done (loop $pair
      (br_if $pairs_done (i32.ge_u (local.get $w) (local.get $end2)))
      (local.set $v0 (v128.load offset=0 (local.get $w)))
      (local.set $v1 (v128.load offset=16 (local.get $w)))
      (local.set $v2 (v128.load offset=32 (local.get $w)))
      (local.set $v3 (v128.load offset=48 (local.get $w)))
      (local.set $xe (v128.load offset=0 (local.get $x)))
      (local.set $xo (v128.load offset=16 (local.get $x)))
      (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (i32x4.shl (local.get $v0) (i32.const 16)) (local.get $xe))))
      (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (i32x4.shl (local.get $v1) (i32.const 16)) (local.get $xe))))
      (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (i32x4.shl (local.get $v2) (i32.const 16)) (local.get $xe))))
      (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (i32x4.shl (local.get $v3) (i32.const 16)) (local.get $xe))))
      (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (v128.and (local.get $v0) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (v128.and (local.get $v1) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (v128.and (local.get $v2) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (v128.and (local.get $v3) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $v0 (v128.load offset=64 (local.get $w)))
      (local.set $v1 (v128.load offset=80 (local.get $w)))
      (local.set $v2 (v128.load offset=96 (local.get $w)))
      (local.set $v3 (v128.load offset=112 (local.get $w)))
      (local.set $xe (v128.load offset=32 (local.get $x)))
      (local.set $xo (v128.load offset=48 (local.get $x)))
      (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (i32x4.shl (local.get $v0) (i32.const 16)) (local.get $xe))))
      (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (i32x4.shl (local.get $v1) (i32.const 16)) (local.get $xe))))
      (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (i32x4.shl (local.get $v2) (i32.const 16)) (local.get $xe))))
      (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (i32x4.shl (local.get $v3) (i32.const 16)) (local.get $xe))))
      (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (v128.and (local.get $v0) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (v128.and (local.get $v1) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (v128.and (local.get $v2) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (v128.and (local.get $v3) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $x (i32.add (local.get $x) (i32.const 64)))
      (local.set $w (i32.add (local.get $w) (i32.const 128)))
      (br $pair)))
    (if (i32.lt_u (local.get $w) (local.get $end)) (then
      (local.set $v0 (v128.load offset=0 (local.get $w)))
      (local.set $v1 (v128.load offset=16 (local.get $w)))
      (local.set $v2 (v128.load offset=32 (local.get $w)))
      (local.set $v3 (v128.load offset=48 (local.get $w)))
      (local.set $xe (v128.load offset=0 (local.get $x)))
      (local.set $xo (v128.load offset=16 (local.get $x)))
      (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (i32x4.shl (local.get $v0) (i32.const 16)) (local.get $xe))))
      (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (i32x4.shl (local.get $v1) (i32.const 16)) (local.get $xe))))
      (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (i32x4.shl (local.get $v2) (i32.const 16)) (local.get $xe))))
      (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (i32x4.shl (local.get $v3) (i32.const 16)) (local.get $xe))))
      (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (v128.and (local.get $v0) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (v128.and (local.get $v1) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (v128.and (local.get $v2) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
      (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (v128.and (local.get $v3) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))))
    (f32.store offset=0 (local.get $y) (call $hsum (local.get $a0)))
    (f32.store offset=4 (local.get $y) (call $hsum (local.get $a1)))
    (f32.store offset=8 (local.get $y) (call $hsum (local.get $a2)))
    (f32.store offset=12 (local.get $y) (call $hsum (local.get $a3))))

  ;; ---------------------------------------------------------------- one row x four tokens
  ;; $w: one plain row (a tail row after the last full group), 16 bytes per block; $x: a token quad.
  (func $mm_4t1r (param $w i32) (param $x i32) (param $y i32) (param $cols i32) (param $ys i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local $e v128) (local $o v128) (local $v v128) (local $end i32)
    (local.set $end (i32.add (local.get $w) (i32.shl (local.get $cols) (i32.const 1))))
    (loop $next
      (local.set $v (v128.load (local.get $w)))
      (local.set $e (i32x4.shl (local.get $v) (i32.const 16)))
      (local.set $o (v128.and (local.get $v) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)))
      (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $e) (v128.load offset=0 (local.get $x)))))
      (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $o) (v128.load offset=16 (local.get $x)))))
      (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (local.get $e) (v128.load offset=32 (local.get $x)))))
      (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (local.get $o) (v128.load offset=48 (local.get $x)))))
      (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (local.get $e) (v128.load offset=64 (local.get $x)))))
      (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (local.get $o) (v128.load offset=80 (local.get $x)))))
      (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (local.get $e) (v128.load offset=96 (local.get $x)))))
      (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (local.get $o) (v128.load offset=112 (local.get $x)))))
      (local.set $x (i32.add (local.get $x) (i32.const 128)))
      (br_if $next (i32.lt_u (local.tee $w (i32.add (local.get $w) (i32.const 16))) (local.get $end))))
    (f32.store (local.get $y) (call $hsum (local.get $a0)))
    (local.set $y (i32.add (local.get $y) (local.get $ys)))
    (f32.store (local.get $y) (call $hsum (local.get $a1)))
    (local.set $y (i32.add (local.get $y) (local.get $ys)))
    (f32.store (local.get $y) (call $hsum (local.get $a2)))
    (local.set $y (i32.add (local.get $y) (local.get $ys)))
    (f32.store (local.get $y) (call $hsum (local.get $a3))))

  ;; ---------------------------------------------------------------- two rows x four tokens
  ;; $w: rows 0-1 (or 2-3, at +32) of a 4-row group, 64 bytes per block; $x: a token quad,
  ;; 128 bytes per block (token t's even/odd halves at 32t, 32t+16). y[t][r] at y + t*ys + 4r.
  (func $mm_4t2r (param $w i32) (param $x i32) (param $y i32) (param $cols i32) (param $ys i32)
    (local $a00 v128) (local $a01 v128) (local $a10 v128) (local $a11 v128)
    (local $a20 v128) (local $a21 v128) (local $a30 v128) (local $a31 v128)
    (local $e0 v128) (local $o0 v128) (local $e1 v128) (local $o1 v128) (local $v v128)
    (local $xe v128) (local $xo v128) (local $end i32)
    (local.set $end (i32.add (local.get $w) (i32.shl (local.get $cols) (i32.const 3))))
    (loop $next
      (local.set $v (v128.load offset=0 (local.get $w)))
      (local.set $e0 (i32x4.shl (local.get $v) (i32.const 16)))
      (local.set $o0 (v128.and (local.get $v) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)))
      (local.set $v (v128.load offset=16 (local.get $w)))
      (local.set $e1 (i32x4.shl (local.get $v) (i32.const 16)))
      (local.set $o1 (v128.and (local.get $v) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)))
      ;; token 0
      (local.set $xe (v128.load offset=0 (local.get $x)))
      (local.set $xo (v128.load offset=16 (local.get $x)))
      (local.set $a00 (f32x4.add (local.get $a00) (f32x4.mul (local.get $e0) (local.get $xe))))
      (local.set $a00 (f32x4.add (local.get $a00) (f32x4.mul (local.get $o0) (local.get $xo))))
      (local.set $a01 (f32x4.add (local.get $a01) (f32x4.mul (local.get $e1) (local.get $xe))))
      (local.set $a01 (f32x4.add (local.get $a01) (f32x4.mul (local.get $o1) (local.get $xo))))
      ;; token 1
      (local.set $xe (v128.load offset=32 (local.get $x)))
      (local.set $xo (v128.load offset=48 (local.get $x)))
      (local.set $a10 (f32x4.add (local.get $a10) (f32x4.mul (local.get $e0) (local.get $xe))))
      (local.set $a10 (f32x4.add (local.get $a10) (f32x4.mul (local.get $o0) (local.get $xo))))
      (local.set $a11 (f32x4.add (local.get $a11) (f32x4.mul (local.get $e1) (local.get $xe))))
      (local.set $a11 (f32x4.add (local.get $a11) (f32x4.mul (local.get $o1) (local.get $xo))))
      ;; token 2
      (local.set $xe (v128.load offset=64 (local.get $x)))
      (local.set $xo (v128.load offset=80 (local.get $x)))
      (local.set $a20 (f32x4.add (local.get $a20) (f32x4.mul (local.get $e0) (local.get $xe))))
      (local.set $a20 (f32x4.add (local.get $a20) (f32x4.mul (local.get $o0) (local.get $xo))))
      (local.set $a21 (f32x4.add (local.get $a21) (f32x4.mul (local.get $e1) (local.get $xe))))
      (local.set $a21 (f32x4.add (local.get $a21) (f32x4.mul (local.get $o1) (local.get $xo))))
      ;; token 3
      (local.set $xe (v128.load offset=96 (local.get $x)))
      (local.set $xo (v128.load offset=112 (local.get $x)))
      (local.set $a30 (f32x4.add (local.get $a30) (f32x4.mul (local.get $e0) (local.get $xe))))
      (local.set $a30 (f32x4.add (local.get $a30) (f32x4.mul (local.get $o0) (local.get $xo))))
      (local.set $a31 (f32x4.add (local.get $a31) (f32x4.mul (local.get $e1) (local.get $xe))))
      (local.set $a31 (f32x4.add (local.get $a31) (f32x4.mul (local.get $o1) (local.get $xo))))
      (local.set $x (i32.add (local.get $x) (i32.const 128)))
      (br_if $next (i32.lt_u (local.tee $w (i32.add (local.get $w) (i32.const 64))) (local.get $end))))
    (f32.store offset=0 (local.get $y) (call $hsum (local.get $a00)))
    (f32.store offset=4 (local.get $y) (call $hsum (local.get $a01)))
    (local.set $y (i32.add (local.get $y) (local.get $ys)))
    (f32.store offset=0 (local.get $y) (call $hsum (local.get $a10)))
    (f32.store offset=4 (local.get $y) (call $hsum (local.get $a11)))
    (local.set $y (i32.add (local.get $y) (local.get $ys)))
    (f32.store offset=0 (local.get $y) (call $hsum (local.get $a20)))
    (f32.store offset=4 (local.get $y) (call $hsum (local.get $a21)))
    (local.set $y (i32.add (local.get $y) (local.get $ys)))
    (f32.store offset=0 (local.get $y) (call $hsum (local.get $a30)))
    (f32.store offset=4 (local.get $y) (call $hsum (local.get $a31))))

  ;; ---------------------------------------------------------------- matmul driver
  ;; Y[t][r] = dot(W[r], X[t]) for t in [0, T), r in [r0, r1); r0 is a multiple of 4, r1 is rows or
  ;; a multiple of 4. W: the interleaved image at $w; X: packed by pack_x for this T; Y: f32 [T][rows].
  ;; Rows are walked in chunks of 32 so a chunk of W stays in cache while every token passes.
  (func (export "matmul") (param $w i32) (param $x i32) (param $y i32) (param $T i32)
        (param $cols i32) (param $rows i32) (param $r0 i32) (param $r1 i32)
    (local $rb i32) (local $re i32) (local $r i32) (local $t i32) (local $tq i32)
    (local $rs i32) (local $xs i32) (local $ys i32) (local $xt i32) (local $yt i32) (local $g i32)
    (local.set $rs (i32.shl (local.get $cols) (i32.const 1)))
    (local.set $xs (i32.shl (local.get $cols) (i32.const 2)))
    (local.set $ys (i32.shl (local.get $rows) (i32.const 2)))
    (local.set $tq (i32.and (local.get $T) (i32.const -4)))
    (local.set $rb (local.get $r0))
    (block $rows_done (loop $row_chunk
      (br_if $rows_done (i32.ge_u (local.get $rb) (local.get $r1)))
      (local.set $re (i32.add (local.get $rb) (i32.const 32)))
      (if (i32.gt_u (local.get $re) (local.get $r1)) (then (local.set $re (local.get $r1))))
      ;; token quads: 4-token x 2-row tiles, then the tail rows one at a time
      (local.set $t (i32.const 0))
      (block $quads_done (loop $quad
        (br_if $quads_done (i32.ge_u (local.get $t) (local.get $tq)))
        (local.set $xt (i32.add (local.get $x) (i32.mul (local.get $t) (local.get $xs))))
        (local.set $yt (i32.add (local.get $y) (i32.mul (local.get $t) (local.get $ys))))
        (local.set $r (local.get $rb))
        (block $groups_done (loop $group
          (br_if $groups_done (i32.gt_u (i32.add (local.get $r) (i32.const 4)) (local.get $re)))
          (local.set $g (i32.add (local.get $w) (i32.mul (local.get $r) (local.get $rs))))
          (call $mm_4t2r (local.get $g) (local.get $xt)
            (i32.add (local.get $yt) (i32.shl (local.get $r) (i32.const 2))) (local.get $cols) (local.get $ys))
          (call $mm_4t2r (i32.add (local.get $g) (i32.const 32)) (local.get $xt)
            (i32.add (local.get $yt) (i32.shl (i32.add (local.get $r) (i32.const 2)) (i32.const 2))) (local.get $cols) (local.get $ys))
          (local.set $r (i32.add (local.get $r) (i32.const 4)))
          (br $group)))
        (block $tail_done (loop $tail
          (br_if $tail_done (i32.ge_u (local.get $r) (local.get $re)))
          (call $mm_4t1r (i32.add (local.get $w) (i32.mul (local.get $r) (local.get $rs))) (local.get $xt)
            (i32.add (local.get $yt) (i32.shl (local.get $r) (i32.const 2))) (local.get $cols) (local.get $ys))
          (local.set $r (i32.add (local.get $r) (i32.const 1)))
          (br $tail)))
        (local.set $t (i32.add (local.get $t) (i32.const 4)))
        (br $quad)))
      ;; remaining tokens one at a time: 4-row groups, then the tail rows
      (block $singles_done (loop $single
        (br_if $singles_done (i32.ge_u (local.get $t) (local.get $T)))
        (local.set $xt (i32.add (local.get $x) (i32.mul (local.get $t) (local.get $xs))))
        (local.set $yt (i32.add (local.get $y) (i32.mul (local.get $t) (local.get $ys))))
        (local.set $r (local.get $rb))
        (block $fours_done (loop $four
          (br_if $fours_done (i32.gt_u (i32.add (local.get $r) (i32.const 4)) (local.get $re)))
          (call $mv_4r (i32.add (local.get $w) (i32.mul (local.get $r) (local.get $rs))) (local.get $xt)
            (i32.add (local.get $yt) (i32.shl (local.get $r) (i32.const 2))) (local.get $cols))
          (local.set $r (i32.add (local.get $r) (i32.const 4)))
          (br $four)))
        (block $ones_done (loop $one
          (br_if $ones_done (i32.ge_u (local.get $r) (local.get $re)))
          (call $mv_1r (i32.add (local.get $w) (i32.mul (local.get $r) (local.get $rs))) (local.get $xt)
            (i32.add (local.get $yt) (i32.shl (local.get $r) (i32.const 2))) (local.get $cols))
          (local.set $r (i32.add (local.get $r) (i32.const 1)))
          (br $one)))
        (local.set $t (i32.add (local.get $t) (i32.const 1)))
        (br $single)))
      (local.set $rb (local.get $re))
      (br $row_chunk))))

  ;; ---------------------------------------------------------------- input packing
  ;; Copies $nb blocks of 8 f32 from $s (contiguous) to $d, each block reordered
  ;; [s0 s2 s4 s6 s1 s3 s5 s7], consecutive blocks $step bytes apart at the destination.
  (func $permute_blocks (param $s i32) (param $d i32) (param $nb i32) (param $step i32)
    (local $a v128) (local $b v128) (local $end i32)
    (local.set $end (i32.add (local.get $s) (i32.shl (local.get $nb) (i32.const 5))))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $s) (local.get $end)))
      (local.set $a (v128.load (local.get $s)))
      (local.set $b (v128.load offset=16 (local.get $s)))
      (v128.store (local.get $d)
        (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27 (local.get $a) (local.get $b)))
      (v128.store offset=16 (local.get $d)
        (i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31 (local.get $a) (local.get $b)))
      (local.set $s (i32.add (local.get $s) (i32.const 32)))
      (local.set $d (i32.add (local.get $d) (local.get $step)))
      (br $next))))

  ;; Packs X f32 [T][cols] for matmul: tokens 4q..4q+3 become a quad (per block of 8 columns:
  ;; token 0's permuted block, then token 1's, 2's, 3's: 128 bytes); the T % 4 last tokens are
  ;; plain permuted rows. Every token keeps its row's byte range [t*cols*4, (t+1)*cols*4).
  (func (export "pack_x") (param $src i32) (param $dst i32) (param $T i32) (param $cols i32)
    (local $t i32) (local $tq i32) (local $rowb i32) (local $nb i32)
    (local.set $rowb (i32.shl (local.get $cols) (i32.const 2)))
    (local.set $nb (i32.shr_u (local.get $cols) (i32.const 3)))
    (local.set $tq (i32.and (local.get $T) (i32.const -4)))
    (block $quads_done (loop $quad_token
      (br_if $quads_done (i32.ge_u (local.get $t) (local.get $tq)))
      (call $permute_blocks
        (i32.add (local.get $src) (i32.mul (local.get $t) (local.get $rowb)))
        (i32.add (i32.add (local.get $dst) (i32.mul (i32.and (local.get $t) (i32.const -4)) (local.get $rowb)))
                 (i32.shl (i32.and (local.get $t) (i32.const 3)) (i32.const 5)))
        (local.get $nb) (i32.const 128))
      (local.set $t (i32.add (local.get $t) (i32.const 1)))
      (br $quad_token)))
    (block $rest_done (loop $rest
      (br_if $rest_done (i32.ge_u (local.get $t) (local.get $T)))
      (call $permute_blocks
        (i32.add (local.get $src) (i32.mul (local.get $t) (local.get $rowb)))
        (i32.add (local.get $dst) (i32.mul (local.get $t) (local.get $rowb)))
        (local.get $nb) (i32.const 32))
      (local.set $t (i32.add (local.get $t) (i32.const 1)))
      (br $rest))))

  ;; ---------------------------------------------------------------- RMS norm
  ;; out[i] = (x[i] * inv) * w[i],  inv = 1 / sqrt(ss / n + eps),
  ;; ss = hsum of four lane sums, lane j summing x[4k+j]^2 in increasing k. n % 4 == 0; w is f32.
  (func (export "rmsnorm") (param $x i32) (param $w i32) (param $out i32) (param $n i32) (param $eps f32)
    (local $acc v128) (local $v v128) (local $i i32) (local $end i32) (local $inv v128)
    (local.set $end (i32.shl (local.get $n) (i32.const 2)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
      (local.set $v (v128.load (i32.add (local.get $x) (local.get $i))))
      (local.set $acc (f32x4.add (local.get $acc) (f32x4.mul (local.get $v) (local.get $v))))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br $next)))
    (local.set $inv (f32x4.splat
      (f32.div (f32.const 1)
        (f32.sqrt (f32.add (f32.div (call $hsum (local.get $acc)) (f32.convert_i32_u (local.get $n))) (local.get $eps))))))
    (local.set $i (i32.const 0))
    (block $done2 (loop $next2
      (br_if $done2 (i32.ge_u (local.get $i) (local.get $end)))
      (v128.store (i32.add (local.get $out) (local.get $i))
        (f32x4.mul (f32x4.mul (v128.load (i32.add (local.get $x) (local.get $i))) (local.get $inv))
                   (v128.load (i32.add (local.get $w) (local.get $i)))))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br $next2))))

  ;; ---------------------------------------------------------------- attention scores
  ;; out[s] = sum_d q[d] * K[d][s] (d increasing) for s in [0, n rounded up to 4).
  ;; K: bf16 [D][S] of one KV head (positions contiguous); q, out: f32.
  (func (export "attn_scores") (param $q i32) (param $k i32) (param $S i32) (param $D i32) (param $n i32) (param $out i32)
    (local $d i32) (local $s i32) (local $nb i32) (local $qd v128) (local $row i32) (local $o i32)
    (local.set $nb (i32.shl (i32.and (i32.add (local.get $n) (i32.const 3)) (i32.const -4)) (i32.const 2)))
    (local.set $s (i32.const 0))
    (block $z_done (loop $z
      (br_if $z_done (i32.ge_u (local.get $s) (local.get $nb)))
      (v128.store (i32.add (local.get $out) (local.get $s)) (v128.const i32x4 0 0 0 0))
      (local.set $s (i32.add (local.get $s) (i32.const 16)))
      (br $z)))
    (block $d_done (loop $each_d
      (br_if $d_done (i32.ge_u (local.get $d) (local.get $D)))
      (local.set $qd (f32x4.splat (f32.load (i32.add (local.get $q) (i32.shl (local.get $d) (i32.const 2))))))
      (local.set $row (i32.add (local.get $k) (i32.shl (i32.mul (local.get $d) (local.get $S)) (i32.const 1))))
      (local.set $o (local.get $out))
      (local.set $s (i32.const 0))
      (block $s_done (loop $each_s
        (br_if $s_done (i32.ge_u (local.get $s) (local.get $nb)))
        (v128.store (local.get $o)
          (f32x4.add (v128.load (local.get $o))
            (f32x4.mul (local.get $qd) (i32x4.shl (v128.load16x4_u (local.get $row)) (i32.const 16)))))
        (local.set $o (i32.add (local.get $o) (i32.const 16)))
        (local.set $row (i32.add (local.get $row) (i32.const 8)))
        (local.set $s (i32.add (local.get $s) (i32.const 16)))
        (br $each_s)))
      (local.set $d (i32.add (local.get $d) (i32.const 1)))
      (br $each_d))))

  ;; ---------------------------------------------------------------- attention values
  ;; out[d] = sum_s p[s] * V[s][d] (s increasing) for d in [0, D); V: bf16 [S][D] of one KV head.
  (func (export "attn_values") (param $p i32) (param $v i32) (param $D i32) (param $n i32) (param $out i32)
    (local $s i32) (local $i i32) (local $db i32) (local $ps v128) (local $row i32)
    (local.set $db (i32.shl (local.get $D) (i32.const 2)))
    (block $z_done (loop $z
      (br_if $z_done (i32.ge_u (local.get $i) (local.get $db)))
      (v128.store (i32.add (local.get $out) (local.get $i)) (v128.const i32x4 0 0 0 0))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br $z)))
    (block $s_done (loop $each_s
      (br_if $s_done (i32.ge_u (local.get $s) (local.get $n)))
      (local.set $ps (f32x4.splat (f32.load (i32.add (local.get $p) (i32.shl (local.get $s) (i32.const 2))))))
      (local.set $row (i32.add (local.get $v) (i32.mul (local.get $s) (i32.shl (local.get $D) (i32.const 1)))))
      (local.set $i (i32.const 0))
      (block $d_done (loop $each_d
        (br_if $d_done (i32.ge_u (local.get $i) (local.get $db)))
        (v128.store (i32.add (local.get $out) (local.get $i))
          (f32x4.add (v128.load (i32.add (local.get $out) (local.get $i)))
            (f32x4.mul (local.get $ps)
              (i32x4.shl (v128.load16x4_u (i32.add (local.get $row) (i32.shr_u (local.get $i) (i32.const 1)))) (i32.const 16)))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $each_d)))
      (local.set $s (i32.add (local.get $s) (i32.const 1)))
      (br $each_s))))

  ;; ---------------------------------------------------------------- bandwidth roofline
  ;; Streams `bytes` (a multiple of 128) from $p, eight 16-byte loads per trip into four
  ;; independent sums, so nothing is dead: the fastest plain read loop we have, the bench's reference.
  (func (export "stream_read") (param $p i32) (param $bytes i32) (result i32)
    (local $a v128) (local $b v128) (local $c v128) (local $d v128) (local $end i32)
    (local.set $end (i32.add (local.get $p) (local.get $bytes)))
    (block $done
      (br_if $done (i32.eqz (local.get $bytes)))
      (loop $next
        (local.set $a (i32x4.add (local.get $a) (v128.load offset=0 (local.get $p))))
        (local.set $b (i32x4.add (local.get $b) (v128.load offset=16 (local.get $p))))
        (local.set $c (i32x4.add (local.get $c) (v128.load offset=32 (local.get $p))))
        (local.set $d (i32x4.add (local.get $d) (v128.load offset=48 (local.get $p))))
        (local.set $a (i32x4.add (local.get $a) (v128.load offset=64 (local.get $p))))
        (local.set $b (i32x4.add (local.get $b) (v128.load offset=80 (local.get $p))))
        (local.set $c (i32x4.add (local.get $c) (v128.load offset=96 (local.get $p))))
        (local.set $d (i32x4.add (local.get $d) (v128.load offset=112 (local.get $p))))
        (br_if $next (i32.lt_u (local.tee $p (i32.add (local.get $p) (i32.const 128))) (local.get $end)))))
    (i32x4.extract_lane 0 (i32x4.add (i32x4.add (local.get $a) (local.get $b)) (i32x4.add (local.get $c) (local.get $d)))))
)
