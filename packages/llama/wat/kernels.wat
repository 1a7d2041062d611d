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
;;   group of 4 rows, or in a 4-token x 4-row tile gives the same bits.
;; Attention scores sum over head_dim in increasing d, values over positions in increasing s.
;; exp (softmax, SiLU) is computed here with fixed f32 operations (see $exp4), no FMA, so it is
;; the same in every process and for every batch shape.
;; Columns must be a multiple of 8; head_dim a multiple of 4.

(module
  (import "env" "memory" (memory 1 65536 shared))

  ;; Where loads done only to bring cache lines in are folded, so they are not dead code. Never
  ;; read by any result.
  (global $sink (mut i32) (i32.const 0))

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
  ;; $groups consecutive 4-row groups from $w (64 bytes per block of 8 columns per group), one
  ;; permuted x row (32 bytes per block); y[4g + r] for row r of group g. Two blocks per trip,
  ;; then the odd block if cols/8 is odd; blocks in order; the horizontal sums written out inline.
  (func $mv_4r (param $w i32) (param $x i32) (param $y i32) (param $cols i32) (param $groups i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local $v0 v128) (local $v1 v128) (local $v2 v128) (local $v3 v128)
    (local $xe v128) (local $xo v128) (local $end i32) (local $end2 i32) (local $x0 i32) (local $yend i32)
    (local.set $x0 (local.get $x))
    (local.set $yend (i32.add (local.get $y) (i32.shl (local.get $groups) (i32.const 4))))
    (block $all_done (loop $group
      (br_if $all_done (i32.ge_u (local.get $y) (local.get $yend)))
      (local.set $a0 (v128.const i32x4 0 0 0 0))
      (local.set $a1 (v128.const i32x4 0 0 0 0))
      (local.set $a2 (v128.const i32x4 0 0 0 0))
      (local.set $a3 (v128.const i32x4 0 0 0 0))
      (local.set $x (local.get $x0))
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
        (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (v128.and (local.get $v3) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)) (local.get $xo))))
        (local.set $w (local.get $end))))
      (f32.store offset=0 (local.get $y) (f32.add (f32.add (f32x4.extract_lane 0 (local.get $a0)) (f32x4.extract_lane 1 (local.get $a0))) (f32.add (f32x4.extract_lane 2 (local.get $a0)) (f32x4.extract_lane 3 (local.get $a0)))))
      (f32.store offset=4 (local.get $y) (f32.add (f32.add (f32x4.extract_lane 0 (local.get $a1)) (f32x4.extract_lane 1 (local.get $a1))) (f32.add (f32x4.extract_lane 2 (local.get $a1)) (f32x4.extract_lane 3 (local.get $a1)))))
      (f32.store offset=8 (local.get $y) (f32.add (f32.add (f32x4.extract_lane 0 (local.get $a2)) (f32x4.extract_lane 1 (local.get $a2))) (f32.add (f32x4.extract_lane 2 (local.get $a2)) (f32x4.extract_lane 3 (local.get $a2)))))
      (f32.store offset=12 (local.get $y) (f32.add (f32.add (f32x4.extract_lane 0 (local.get $a3)) (f32x4.extract_lane 1 (local.get $a3))) (f32.add (f32x4.extract_lane 2 (local.get $a3)) (f32x4.extract_lane 3 (local.get $a3)))))
      (local.set $y (i32.add (local.get $y) (i32.const 16)))
      (br $group))))

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

  ;; ---------------------------------------------------------------- four rows x four tokens
  ;; $groups consecutive 4-row groups from $w (64 bytes per block: one cache line feeds all 16
  ;; outputs of a block), $x a token quad (128 bytes per block). Per block the quad's 8 input
  ;; vectors are loaded once into registers; each row's 8 weights are widened once and used by
  ;; the 4 tokens. The 16 accumulators live at $acc (256 bytes of per-thread scratch): each update
  ;; is a load, the two adds of the fixed order and a store. (16 accumulators plus the inputs do
  ;; not fit in 16 registers; V8 would spill them anyway, and the stores keep it from hoisting
  ;; every load of the loop to its top.) y[t][4g + r] at y + t*ys + 16g + 4r.
  (func $mm_4t4r (param $w i32) (param $x i32) (param $y i32) (param $cols i32) (param $ys i32) (param $acc i32) (param $groups i32)
    (local $e v128) (local $o v128) (local $v v128) (local $xe0 v128) (local $xo0 v128) (local $xe1 v128) (local $xo1 v128) (local $xe2 v128) (local $xo2 v128) (local $xe3 v128) (local $xo3 v128) (local $end i32) (local $x0 i32) (local $yend i32) (local $yt i32)
    (local.set $x0 (local.get $x))
    (local.set $yend (i32.add (local.get $y) (i32.shl (local.get $groups) (i32.const 4))))
    (block $all_done (loop $group
      (br_if $all_done (i32.ge_u (local.get $y) (local.get $yend)))
      (v128.store offset=0 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=16 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=32 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=48 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=64 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=80 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=96 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=112 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=128 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=144 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=160 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=176 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=192 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=208 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=224 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (v128.store offset=240 (local.get $acc) (v128.const i32x4 0 0 0 0))
      (local.set $x (local.get $x0))
      (local.set $end (i32.add (local.get $w) (i32.shl (local.get $cols) (i32.const 3))))
      (loop $next
        (local.set $xe0 (v128.load offset=0 (local.get $x)))
        (local.set $xo0 (v128.load offset=16 (local.get $x)))
        (local.set $xe1 (v128.load offset=32 (local.get $x)))
        (local.set $xo1 (v128.load offset=48 (local.get $x)))
        (local.set $xe2 (v128.load offset=64 (local.get $x)))
        (local.set $xo2 (v128.load offset=80 (local.get $x)))
        (local.set $xe3 (v128.load offset=96 (local.get $x)))
        (local.set $xo3 (v128.load offset=112 (local.get $x)))
        (local.set $v (v128.load offset=0 (local.get $w)))
        (local.set $e (i32x4.shl (local.get $v) (i32.const 16)))
        (local.set $o (v128.and (local.get $v) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)))
        (v128.store offset=0 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=0 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe0))) (f32x4.mul (local.get $o) (local.get $xo0))))
        (v128.store offset=16 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=16 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe1))) (f32x4.mul (local.get $o) (local.get $xo1))))
        (v128.store offset=32 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=32 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe2))) (f32x4.mul (local.get $o) (local.get $xo2))))
        (v128.store offset=48 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=48 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe3))) (f32x4.mul (local.get $o) (local.get $xo3))))
        (local.set $v (v128.load offset=16 (local.get $w)))
        (local.set $e (i32x4.shl (local.get $v) (i32.const 16)))
        (local.set $o (v128.and (local.get $v) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)))
        (v128.store offset=64 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=64 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe0))) (f32x4.mul (local.get $o) (local.get $xo0))))
        (v128.store offset=80 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=80 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe1))) (f32x4.mul (local.get $o) (local.get $xo1))))
        (v128.store offset=96 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=96 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe2))) (f32x4.mul (local.get $o) (local.get $xo2))))
        (v128.store offset=112 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=112 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe3))) (f32x4.mul (local.get $o) (local.get $xo3))))
        (local.set $v (v128.load offset=32 (local.get $w)))
        (local.set $e (i32x4.shl (local.get $v) (i32.const 16)))
        (local.set $o (v128.and (local.get $v) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)))
        (v128.store offset=128 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=128 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe0))) (f32x4.mul (local.get $o) (local.get $xo0))))
        (v128.store offset=144 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=144 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe1))) (f32x4.mul (local.get $o) (local.get $xo1))))
        (v128.store offset=160 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=160 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe2))) (f32x4.mul (local.get $o) (local.get $xo2))))
        (v128.store offset=176 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=176 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe3))) (f32x4.mul (local.get $o) (local.get $xo3))))
        (local.set $v (v128.load offset=48 (local.get $w)))
        (local.set $e (i32x4.shl (local.get $v) (i32.const 16)))
        (local.set $o (v128.and (local.get $v) (v128.const i32x4 0xffff0000 0xffff0000 0xffff0000 0xffff0000)))
        (v128.store offset=192 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=192 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe0))) (f32x4.mul (local.get $o) (local.get $xo0))))
        (v128.store offset=208 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=208 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe1))) (f32x4.mul (local.get $o) (local.get $xo1))))
        (v128.store offset=224 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=224 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe2))) (f32x4.mul (local.get $o) (local.get $xo2))))
        (v128.store offset=240 (local.get $acc) (f32x4.add (f32x4.add (v128.load offset=240 (local.get $acc))
          (f32x4.mul (local.get $e) (local.get $xe3))) (f32x4.mul (local.get $o) (local.get $xo3))))
        (local.set $x (i32.add (local.get $x) (i32.const 128)))
        (br_if $next (i32.lt_u (local.tee $w (i32.add (local.get $w) (i32.const 64))) (local.get $end))))
      (local.set $yt (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 0))))
      (f32.store offset=0 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=0 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=0 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=0 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=0 (local.get $acc))))))
      (f32.store offset=4 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=64 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=64 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=64 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=64 (local.get $acc))))))
      (f32.store offset=8 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=128 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=128 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=128 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=128 (local.get $acc))))))
      (f32.store offset=12 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=192 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=192 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=192 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=192 (local.get $acc))))))
      (local.set $yt (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 1))))
      (f32.store offset=0 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=16 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=16 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=16 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=16 (local.get $acc))))))
      (f32.store offset=4 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=80 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=80 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=80 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=80 (local.get $acc))))))
      (f32.store offset=8 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=144 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=144 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=144 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=144 (local.get $acc))))))
      (f32.store offset=12 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=208 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=208 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=208 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=208 (local.get $acc))))))
      (local.set $yt (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 2))))
      (f32.store offset=0 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=32 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=32 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=32 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=32 (local.get $acc))))))
      (f32.store offset=4 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=96 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=96 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=96 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=96 (local.get $acc))))))
      (f32.store offset=8 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=160 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=160 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=160 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=160 (local.get $acc))))))
      (f32.store offset=12 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=224 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=224 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=224 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=224 (local.get $acc))))))
      (local.set $yt (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 3))))
      (f32.store offset=0 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=48 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=48 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=48 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=48 (local.get $acc))))))
      (f32.store offset=4 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=112 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=112 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=112 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=112 (local.get $acc))))))
      (f32.store offset=8 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=176 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=176 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=176 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=176 (local.get $acc))))))
      (f32.store offset=12 (local.get $yt) (f32.add (f32.add (f32x4.extract_lane 0 (v128.load offset=240 (local.get $acc))) (f32x4.extract_lane 1 (v128.load offset=240 (local.get $acc)))) (f32.add (f32x4.extract_lane 2 (v128.load offset=240 (local.get $acc))) (f32x4.extract_lane 3 (v128.load offset=240 (local.get $acc))))))
      (local.set $y (i32.add (local.get $y) (i32.const 16)))
      (br $group))))

  ;; ---------------------------------------------------------------- matmul driver
  ;; Y[t][r] = dot(W[r], X[t]) for t in [0, T), r in [r0, r1); r0 is a multiple of 4, r1 is rows or
  ;; a multiple of 4. W: the interleaved image at $w; X: packed by pack_x for this T; Y: f32 [T][rows].
  ;; Rows are walked in chunks of 32 so a chunk of W stays in cache while every token passes.
  (func (export "matmul") (param $w i32) (param $x i32) (param $y i32) (param $T i32)
        (param $cols i32) (param $rows i32) (param $r0 i32) (param $r1 i32) (param $acc i32)
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
      ;; token quads: 4-token x 4-row tiles, then the tail rows one at a time
      (local.set $t (i32.const 0))
      (block $quads_done (loop $quad
        (br_if $quads_done (i32.ge_u (local.get $t) (local.get $tq)))
        (local.set $xt (i32.add (local.get $x) (i32.mul (local.get $t) (local.get $xs))))
        (local.set $yt (i32.add (local.get $y) (i32.mul (local.get $t) (local.get $ys))))
        ;; the chunk's full 4-row groups in one call, then the tail rows one at a time
        (local.set $g (i32.shr_u (i32.sub (local.get $re) (local.get $rb)) (i32.const 2)))
        (call $mm_4t4r (i32.add (local.get $w) (i32.mul (local.get $rb) (local.get $rs))) (local.get $xt)
          (i32.add (local.get $yt) (i32.shl (local.get $rb) (i32.const 2))) (local.get $cols) (local.get $ys) (local.get $acc) (local.get $g))
        (local.set $r (i32.add (local.get $rb) (i32.shl (local.get $g) (i32.const 2))))
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
        (local.set $g (i32.shr_u (i32.sub (local.get $re) (local.get $rb)) (i32.const 2)))
        (call $mv_4r (i32.add (local.get $w) (i32.mul (local.get $rb) (local.get $rs))) (local.get $xt)
          (i32.add (local.get $yt) (i32.shl (local.get $rb) (i32.const 2))) (local.get $cols) (local.get $g))
        (local.set $r (i32.add (local.get $rb) (i32.shl (local.get $g) (i32.const 2))))
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
  ;; out[s] = sum_d q[d] * K[d][s] (d increasing, from 0) for s in [0, n rounded up to 4).
  ;; K: bf16 [D][S] of one KV head (positions contiguous); q, out: f32. Positions go in groups of
  ;; 16 (four lane groups summed in registers over d), then one lane group at a time.
  (func $attn_scores (export "attn_scores") (param $q i32) (param $k i32) (param $S i32) (param $D i32) (param $n i32) (param $out i32)
    (local $d i32) (local $sb i32) (local $nb i32) (local $qd v128) (local $row i32) (local $o i32) (local $ks i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local.set $nb (i32.shl (i32.and (i32.add (local.get $n) (i32.const 3)) (i32.const -4)) (i32.const 1)))
    (local.set $ks (i32.shl (local.get $S) (i32.const 1)))
    (block $g_done (loop $group
      (br_if $g_done (i32.gt_u (i32.add (local.get $sb) (i32.const 32)) (local.get $nb)))
      (local.set $a0 (v128.const i32x4 0 0 0 0))
      (local.set $a1 (v128.const i32x4 0 0 0 0))
      (local.set $a2 (v128.const i32x4 0 0 0 0))
      (local.set $a3 (v128.const i32x4 0 0 0 0))
      (local.set $row (i32.add (local.get $k) (local.get $sb)))
      (local.set $d (i32.const 0))
      (block $d_done (loop $each_d
        (br_if $d_done (i32.ge_u (local.get $d) (local.get $D)))
        (local.set $qd (f32x4.splat (f32.load (i32.add (local.get $q) (i32.shl (local.get $d) (i32.const 2))))))
          (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $qd) (i32x4.shl (v128.load16x4_u offset=0 (local.get $row)) (i32.const 16)))))
          (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (local.get $qd) (i32x4.shl (v128.load16x4_u offset=8 (local.get $row)) (i32.const 16)))))
          (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (local.get $qd) (i32x4.shl (v128.load16x4_u offset=16 (local.get $row)) (i32.const 16)))))
          (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (local.get $qd) (i32x4.shl (v128.load16x4_u offset=24 (local.get $row)) (i32.const 16)))))
        (local.set $row (i32.add (local.get $row) (local.get $ks)))
        (local.set $d (i32.add (local.get $d) (i32.const 1)))
        (br $each_d)))
      (local.set $o (i32.add (local.get $out) (i32.shl (local.get $sb) (i32.const 1))))
      (v128.store offset=0 (local.get $o) (local.get $a0))
      (v128.store offset=16 (local.get $o) (local.get $a1))
      (v128.store offset=32 (local.get $o) (local.get $a2))
      (v128.store offset=48 (local.get $o) (local.get $a3))
      (local.set $sb (i32.add (local.get $sb) (i32.const 32)))
      (br $group)))
    (block $b_done (loop $block
      (br_if $b_done (i32.ge_u (local.get $sb) (local.get $nb)))
      (local.set $a0 (v128.const i32x4 0 0 0 0))
      (local.set $row (i32.add (local.get $k) (local.get $sb)))
      (local.set $d (i32.const 0))
      (block $d1_done (loop $each_d1
        (br_if $d1_done (i32.ge_u (local.get $d) (local.get $D)))
        (local.set $qd (f32x4.splat (f32.load (i32.add (local.get $q) (i32.shl (local.get $d) (i32.const 2))))))
        (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $qd) (i32x4.shl (v128.load16x4_u (local.get $row)) (i32.const 16)))))
        (local.set $row (i32.add (local.get $row) (local.get $ks)))
        (local.set $d (i32.add (local.get $d) (i32.const 1)))
        (br $each_d1)))
      (v128.store (i32.add (local.get $out) (i32.shl (local.get $sb) (i32.const 1))) (local.get $a0))
      (local.set $sb (i32.add (local.get $sb) (i32.const 8)))
      (br $block))))

  ;; ---------------------------------------------------------------- attention values
  ;; out[d] = sum_s p[s] * V[s][d] (s increasing, from 0) for d in [0, D); V: bf16 [S][D] of one
  ;; KV head. Dimensions go in groups of 32 (eight lane groups summed in registers over s), then
  ;; one lane group at a time.
  (func $attn_values (export "attn_values") (param $p i32) (param $v i32) (param $D i32) (param $n i32) (param $out i32)
    (local $s i32) (local $db i32) (local $ps v128) (local $row i32) (local $o i32) (local $vs i32) (local $dg i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local $a4 v128) (local $a5 v128) (local $a6 v128) (local $a7 v128)
    (local.set $db (i32.shl (local.get $D) (i32.const 1)))
    (local.set $vs (local.get $db))
    (block $g_done (loop $group
      (br_if $g_done (i32.gt_u (i32.add (local.get $dg) (i32.const 64)) (local.get $db)))
      (local.set $a0 (v128.const i32x4 0 0 0 0))
      (local.set $a1 (v128.const i32x4 0 0 0 0))
      (local.set $a2 (v128.const i32x4 0 0 0 0))
      (local.set $a3 (v128.const i32x4 0 0 0 0))
      (local.set $a4 (v128.const i32x4 0 0 0 0))
      (local.set $a5 (v128.const i32x4 0 0 0 0))
      (local.set $a6 (v128.const i32x4 0 0 0 0))
      (local.set $a7 (v128.const i32x4 0 0 0 0))
      (local.set $row (i32.add (local.get $v) (local.get $dg)))
      (local.set $s (i32.const 0))
      (block $s_done (loop $each_s
        (br_if $s_done (i32.ge_u (local.get $s) (local.get $n)))
        (local.set $ps (f32x4.splat (f32.load (i32.add (local.get $p) (i32.shl (local.get $s) (i32.const 2))))))
          (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $ps) (i32x4.shl (v128.load16x4_u offset=0 (local.get $row)) (i32.const 16)))))
          (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (local.get $ps) (i32x4.shl (v128.load16x4_u offset=8 (local.get $row)) (i32.const 16)))))
          (local.set $a2 (f32x4.add (local.get $a2) (f32x4.mul (local.get $ps) (i32x4.shl (v128.load16x4_u offset=16 (local.get $row)) (i32.const 16)))))
          (local.set $a3 (f32x4.add (local.get $a3) (f32x4.mul (local.get $ps) (i32x4.shl (v128.load16x4_u offset=24 (local.get $row)) (i32.const 16)))))
          (local.set $a4 (f32x4.add (local.get $a4) (f32x4.mul (local.get $ps) (i32x4.shl (v128.load16x4_u offset=32 (local.get $row)) (i32.const 16)))))
          (local.set $a5 (f32x4.add (local.get $a5) (f32x4.mul (local.get $ps) (i32x4.shl (v128.load16x4_u offset=40 (local.get $row)) (i32.const 16)))))
          (local.set $a6 (f32x4.add (local.get $a6) (f32x4.mul (local.get $ps) (i32x4.shl (v128.load16x4_u offset=48 (local.get $row)) (i32.const 16)))))
          (local.set $a7 (f32x4.add (local.get $a7) (f32x4.mul (local.get $ps) (i32x4.shl (v128.load16x4_u offset=56 (local.get $row)) (i32.const 16)))))
        (local.set $row (i32.add (local.get $row) (local.get $vs)))
        (local.set $s (i32.add (local.get $s) (i32.const 1)))
        (br $each_s)))
      (local.set $o (i32.add (local.get $out) (i32.shl (local.get $dg) (i32.const 1))))
      (v128.store offset=0 (local.get $o) (local.get $a0))
      (v128.store offset=16 (local.get $o) (local.get $a1))
      (v128.store offset=32 (local.get $o) (local.get $a2))
      (v128.store offset=48 (local.get $o) (local.get $a3))
      (v128.store offset=64 (local.get $o) (local.get $a4))
      (v128.store offset=80 (local.get $o) (local.get $a5))
      (v128.store offset=96 (local.get $o) (local.get $a6))
      (v128.store offset=112 (local.get $o) (local.get $a7))
      (local.set $dg (i32.add (local.get $dg) (i32.const 64)))
      (br $group)))
    (block $b_done (loop $block
      (br_if $b_done (i32.ge_u (local.get $dg) (local.get $db)))
      (local.set $a0 (v128.const i32x4 0 0 0 0))
      (local.set $row (i32.add (local.get $v) (local.get $dg)))
      (local.set $s (i32.const 0))
      (block $s1_done (loop $each_s1
        (br_if $s1_done (i32.ge_u (local.get $s) (local.get $n)))
        (local.set $ps (f32x4.splat (f32.load (i32.add (local.get $p) (i32.shl (local.get $s) (i32.const 2))))))
        (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $ps) (i32x4.shl (v128.load16x4_u (local.get $row)) (i32.const 16)))))
        (local.set $row (i32.add (local.get $row) (local.get $vs)))
        (local.set $s (i32.add (local.get $s) (i32.const 1)))
        (br $each_s1)))
      (v128.store (i32.add (local.get $out) (i32.shl (local.get $dg) (i32.const 1))) (local.get $a0))
      (local.set $dg (i32.add (local.get $dg) (i32.const 8)))
      (br $block))))

  ;; ---------------------------------------------------------------- exp, fixed operations
  ;; e^x per lane with f32 operations only (no FMA, no relaxed SIMD), so every process and every
  ;; call gives the same bits: x clamped to [-87, 88]; k = nearest(x * log2 e);
  ;; r = (x - k*C1) - k*C2 (C1 + C2 = ln 2, C1 with few bits so k*C1 is exact);
  ;; p = ((((((c6*r + c5)*r + c4)*r + c3)*r + c2)*r + c1) * (r*r) + r) + 1 (Cephes expf);
  ;; result = p * 2^k (k in [-126, 127], the scale built in the exponent bits).
  (func $exp4 (param $x v128) (result v128)
    (local $k v128) (local $r v128) (local $p v128)
    (local.set $x (f32x4.max (f32x4.min (local.get $x) (v128.const f32x4 88 88 88 88))
                             (v128.const f32x4 -87 -87 -87 -87)))
    (local.set $k (f32x4.nearest (f32x4.mul (local.get $x)
      (v128.const f32x4 1.44269504088896341 1.44269504088896341 1.44269504088896341 1.44269504088896341))))
    (local.set $r (f32x4.sub
      (f32x4.sub (local.get $x) (f32x4.mul (local.get $k) (v128.const f32x4 0.693359375 0.693359375 0.693359375 0.693359375)))
      (f32x4.mul (local.get $k) (v128.const f32x4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4))))
    (local.set $p (v128.const f32x4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r)) (v128.const f32x4 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r)) (v128.const f32x4 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r)) (v128.const f32x4 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r)) (v128.const f32x4 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r)) (v128.const f32x4 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1)))
    (local.set $p (f32x4.add (f32x4.add (f32x4.mul (local.get $p) (f32x4.mul (local.get $r) (local.get $r))) (local.get $r))
                             (v128.const f32x4 1 1 1 1)))
    (f32x4.mul (local.get $p)
      (i32x4.shl (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $k)) (v128.const i32x4 127 127 127 127)) (i32.const 23))))

  ;; Exports exp4 over n values (n % 4 == 0) at $src into $dst: the kernel's exp, for tests.
  (func (export "exp_f32") (param $src i32) (param $dst i32) (param $n i32)
    (local $i i32) (local $end i32)
    (local.set $end (i32.shl (local.get $n) (i32.const 2)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
      (v128.store (i32.add (local.get $dst) (local.get $i)) (call $exp4 (v128.load (i32.add (local.get $src) (local.get $i)))))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br $next))))

  ;; ---------------------------------------------------------------- SwiGLU
  ;; For T tokens: act[t][i] = (g / (1 + exp(-g))) * up, g = gu[t][i], up = gu[t][I + i]
  ;; (gu f32 [T][2I], act f32 [T][I]); I % 4 == 0. Per element the same lane operations.
  (func (export "swiglu") (param $gu i32) (param $act i32) (param $I i32) (param $T i32)
    (local $t i32) (local $i i32) (local $ib i32) (local $g v128) (local $gp i32) (local $up i32)
    (local.set $ib (i32.shl (local.get $I) (i32.const 2)))
    (block $t_done (loop $each_t
      (br_if $t_done (i32.ge_u (local.get $t) (local.get $T)))
      (local.set $gp (i32.add (local.get $gu) (i32.mul (local.get $t) (i32.shl (local.get $ib) (i32.const 1)))))
      (local.set $up (i32.add (local.get $gp) (local.get $ib)))
      (local.set $i (i32.const 0))
      (block $i_done (loop $each_i
        (br_if $i_done (i32.ge_u (local.get $i) (local.get $ib)))
        (local.set $g (v128.load (i32.add (local.get $gp) (local.get $i))))
        (v128.store (i32.add (local.get $act) (local.get $i))
          (f32x4.mul
            (f32x4.div (local.get $g)
              (f32x4.add (v128.const f32x4 1 1 1 1) (call $exp4 (f32x4.neg (local.get $g)))))
            (v128.load (i32.add (local.get $up) (local.get $i)))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $each_i)))
      (local.set $act (i32.add (local.get $act) (local.get $ib)))
      (local.set $t (i32.add (local.get $t) (i32.const 1)))
      (br $each_t))))

  ;; ---------------------------------------------------------------- softmax
  ;; p[i] = e_i / sum, e_i = exp(z_i - max z), z_i = p[i] * scale, over i in [0, n); the sum in
  ;; increasing i (f32), then each e_i * (1 / sum). p must have room for n rounded up to 4.
  (func $softmax (export "softmax") (param $p i32) (param $n i32) (param $scale f32)
    (local $i i32) (local $end i32) (local $end4 i32) (local $z f32) (local $max f32) (local $sum f32)
    (local $mv v128) (local $inv v128)
    (local.set $end (i32.shl (local.get $n) (i32.const 2)))
    (local.set $end4 (i32.and (i32.add (local.get $end) (i32.const 15)) (i32.const -16)))
    (local.set $max (f32.const -inf))
    (block $m_done (loop $m
      (br_if $m_done (i32.ge_u (local.get $i) (local.get $end)))
      (local.set $z (f32.mul (f32.load (i32.add (local.get $p) (local.get $i))) (local.get $scale)))
      (f32.store (i32.add (local.get $p) (local.get $i)) (local.get $z))
      (if (f32.gt (local.get $z) (local.get $max)) (then (local.set $max (local.get $z))))
      (local.set $i (i32.add (local.get $i) (i32.const 4)))
      (br $m)))
    (local.set $mv (f32x4.splat (local.get $max)))
    (local.set $i (i32.const 0))
    (block $e_done (loop $e
      (br_if $e_done (i32.ge_u (local.get $i) (local.get $end4)))
      (v128.store (i32.add (local.get $p) (local.get $i))
        (call $exp4 (f32x4.sub (v128.load (i32.add (local.get $p) (local.get $i))) (local.get $mv))))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br $e)))
    (local.set $i (i32.const 0))
    (block $s_done (loop $s
      (br_if $s_done (i32.ge_u (local.get $i) (local.get $end)))
      (local.set $sum (f32.add (local.get $sum) (f32.load (i32.add (local.get $p) (local.get $i)))))
      (local.set $i (i32.add (local.get $i) (i32.const 4)))
      (br $s)))
    (local.set $inv (f32x4.splat (f32.div (f32.const 1) (local.get $sum))))
    (local.set $i (i32.const 0))
    (block $n_done (loop $nrm
      (br_if $n_done (i32.ge_u (local.get $i) (local.get $end4)))
      (v128.store (i32.add (local.get $p) (local.get $i))
        (f32x4.mul (v128.load (i32.add (local.get $p) (local.get $i))) (local.get $inv)))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br $nrm))))

  ;; ---------------------------------------------------------------- attention of one token
  ;; For each query head h in [0, H): scores over positions [0, n) against K of KV head
  ;; h / group (attn_scores), softmax at `scale`, then the weighted sum of V (attn_values) into
  ;; out + h*D*4. q: f32 [H][D]; k, v: one layer of one cache (K [KV][D][S], V [KV][S][D], bf16);
  ;; p: f32 scratch for n rounded up to 4 scores.
  (func (export "attention") (param $q i32) (param $k i32) (param $v i32) (param $S i32) (param $D i32)
        (param $n i32) (param $H i32) (param $group i32) (param $scale f32) (param $p i32) (param $out i32)
    (local $h i32) (local $g i32)
    (block $done (loop $each_h
      (br_if $done (i32.ge_u (local.get $h) (local.get $H)))
      (local.set $g (i32.div_u (local.get $h) (local.get $group)))
      (call $attn_scores (i32.add (local.get $q) (i32.shl (i32.mul (local.get $h) (local.get $D)) (i32.const 2)))
        (i32.add (local.get $k) (i32.shl (i32.mul (i32.mul (local.get $g) (local.get $D)) (local.get $S)) (i32.const 1)))
        (local.get $S) (local.get $D) (local.get $n) (local.get $p))
      (call $softmax (local.get $p) (local.get $n) (local.get $scale))
      (call $attn_values (local.get $p)
        (i32.add (local.get $v) (i32.shl (i32.mul (i32.mul (local.get $g) (local.get $S)) (local.get $D)) (i32.const 1)))
        (local.get $D) (local.get $n)
        (i32.add (local.get $out) (i32.shl (i32.mul (local.get $h) (local.get $D)) (i32.const 2))))
      (local.set $h (i32.add (local.get $h) (i32.const 1)))
      (br $each_h))))

  ;; ---------------------------------------------------------------- RoPE and the K/V append
  ;; f32 bits -> bf16 bits, round to nearest even; a NaN stays a quiet NaN.
  (func $bf16 (param $b i32) (result i32)
    (if (result i32) (i32.gt_u (i32.and (local.get $b) (i32.const 0x7fffffff)) (i32.const 0x7f800000))
      (then (i32.and (i32.or (i32.shr_u (local.get $b) (i32.const 16)) (i32.const 0x40)) (i32.const 0xffff)))
      (else (i32.shr_u (i32.add (i32.add (local.get $b) (i32.const 0x7fff))
                                (i32.and (i32.shr_u (local.get $b) (i32.const 16)) (i32.const 1)))
                       (i32.const 16)))))

  ;; One token: rotates $heads consecutive heads of D f32 at $x (rotate_half: for i < D/2,
  ;; x[i] = a*c - b*s, x[i + D/2] = b*c + a*s with a = x[i], b = x[i + D/2], c/s the cos/sin
  ;; row at $cs: D/2 cos then D/2 sin), then writes the KV heads' K (the $kv heads at $k, after
  ;; rotation) and V (the $kv heads after them) as bf16 into the cache: K element (g, d) at
  ;; $kDst + (g*D + d)*S*2 (K is [KV][D][S]; $kDst points at position pos of head 0), V element
  ;; (g, d) at $vDst + (g*S*D + d)*2 (V is [KV][S][D]; $vDst points at position pos of head 0).
  (func (export "rope_kv") (param $x i32) (param $cs i32) (param $heads i32) (param $D i32)
        (param $k i32) (param $kv i32) (param $kDst i32) (param $vDst i32) (param $S i32)
    (local $h i32) (local $i i32) (local $hb i32) (local $hb4 i32) (local $o i32) (local $sn i32)
    (local $a v128) (local $b v128) (local $c v128) (local $s v128)
    (local $fa f32) (local $fb f32) (local $fc f32) (local $fs f32)
    (local $g i32) (local $d i32) (local $v i32) (local $kstep i32) (local $kd i32) (local $vd i32)
    (local.set $hb (i32.shl (local.get $D) (i32.const 1)))        ;; bytes of half a head
    (local.set $hb4 (i32.and (local.get $hb) (i32.const -16)))
    (local.set $sn (i32.add (local.get $cs) (local.get $hb)))
    (block $h_done (loop $each_h
      (br_if $h_done (i32.ge_u (local.get $h) (local.get $heads)))
      (local.set $o (i32.add (local.get $x) (i32.shl (i32.mul (local.get $h) (local.get $D)) (i32.const 2))))
      (local.set $i (i32.const 0))
      (block $v_done (loop $each_v
        (br_if $v_done (i32.ge_u (local.get $i) (local.get $hb4)))
        (local.set $a (v128.load (i32.add (local.get $o) (local.get $i))))
        (local.set $b (v128.load (i32.add (i32.add (local.get $o) (local.get $hb)) (local.get $i))))
        (local.set $c (v128.load (i32.add (local.get $cs) (local.get $i))))
        (local.set $s (v128.load (i32.add (local.get $sn) (local.get $i))))
        (v128.store (i32.add (local.get $o) (local.get $i))
          (f32x4.sub (f32x4.mul (local.get $a) (local.get $c)) (f32x4.mul (local.get $b) (local.get $s))))
        (v128.store (i32.add (i32.add (local.get $o) (local.get $hb)) (local.get $i))
          (f32x4.add (f32x4.mul (local.get $b) (local.get $c)) (f32x4.mul (local.get $a) (local.get $s))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $each_v)))
      (block $t_done (loop $each_t
        (br_if $t_done (i32.ge_u (local.get $i) (local.get $hb)))
        (local.set $fa (f32.load (i32.add (local.get $o) (local.get $i))))
        (local.set $fb (f32.load (i32.add (i32.add (local.get $o) (local.get $hb)) (local.get $i))))
        (local.set $fc (f32.load (i32.add (local.get $cs) (local.get $i))))
        (local.set $fs (f32.load (i32.add (local.get $sn) (local.get $i))))
        (f32.store (i32.add (local.get $o) (local.get $i))
          (f32.sub (f32.mul (local.get $fa) (local.get $fc)) (f32.mul (local.get $fb) (local.get $fs))))
        (f32.store (i32.add (i32.add (local.get $o) (local.get $hb)) (local.get $i))
          (f32.add (f32.mul (local.get $fb) (local.get $fc)) (f32.mul (local.get $fa) (local.get $fs))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $each_t)))
      (local.set $h (i32.add (local.get $h) (i32.const 1)))
      (br $each_h)))
    ;; K/V append, bf16. K's destinations are kv*D values S*2 bytes apart (one cache line each):
    ;; they are read first, all together (independent loads overlap; stores that miss the cache
    ;; would wait for their lines one after another), then written.
    (local.set $v (i32.add (local.get $k) (i32.shl (i32.mul (local.get $kv) (local.get $D)) (i32.const 2))))
    (local.set $kstep (i32.shl (local.get $S) (i32.const 1)))
    (local.set $kd (local.get $kDst))
    (local.set $d (i32.mul (local.get $kv) (local.get $D)))
    (block $touch_done (loop $touch
      (br_if $touch_done (i32.eqz (local.get $d)))
      (local.set $g (i32.xor (local.get $g) (i32.load16_u (local.get $kd))))
      (local.set $kd (i32.add (local.get $kd) (local.get $kstep)))
      (local.set $d (i32.sub (local.get $d) (i32.const 1)))
      (br $touch)))
    (global.set $sink (i32.xor (global.get $sink) (local.get $g)))
    (local.set $g (i32.const 0))
    (block $g_done (loop $each_g
      (br_if $g_done (i32.ge_u (local.get $g) (local.get $kv)))
      (local.set $kd (i32.add (local.get $kDst) (i32.mul (i32.mul (local.get $g) (local.get $D)) (local.get $kstep))))
      (local.set $vd (i32.add (local.get $vDst) (i32.shl (i32.mul (i32.mul (local.get $g) (local.get $S)) (local.get $D)) (i32.const 1))))
      (local.set $d (i32.const 0))
      (block $d_done (loop $each_d
        (br_if $d_done (i32.ge_u (local.get $d) (local.get $D)))
        (i32.store16 (local.get $kd) (call $bf16 (i32.load (local.get $k))))
        (i32.store16 (local.get $vd) (call $bf16 (i32.load (local.get $v))))
        (local.set $k (i32.add (local.get $k) (i32.const 4)))
        (local.set $v (i32.add (local.get $v) (i32.const 4)))
        (local.set $kd (i32.add (local.get $kd) (local.get $kstep)))
        (local.set $vd (i32.add (local.get $vd) (i32.const 2)))
        (local.set $d (i32.add (local.get $d) (i32.const 1)))
        (br $each_d)))
      (local.set $g (i32.add (local.get $g) (i32.const 1)))
      (br $each_g))))

  ;; ---------------------------------------------------------------- residual add
  ;; dst[i] = dst[i] + src[i] for i < n (f32, n % 4 == 0): the residual stream update.
  (func (export "add_f32") (param $dst i32) (param $src i32) (param $n i32)
    (local $i i32) (local $end i32)
    (local.set $end (i32.shl (local.get $n) (i32.const 2)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
      (v128.store (i32.add (local.get $dst) (local.get $i))
        (f32x4.add (v128.load (i32.add (local.get $dst) (local.get $i))) (v128.load (i32.add (local.get $src) (local.get $i)))))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br $next))))

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
  ;; ================================================================ quantized weights
  ;; GGUF blocks kept as loaded: weights of 32 columns per block with f16 scales; inputs quantized
  ;; per token and block of 32 to 16-bit integers (quant_x; llama.cpp uses 8 bits, which costs
  ;; accuracy for nothing here: the kernel widens to i16 either way), integer dot products with
  ;; i32x4.dot_i16x8_s, the scale applied once per block. Images ("4-row groups"): rows go in
  ;; groups of 4, a group holds its blocks in column order; rows must be a multiple of 4 and
  ;; columns of 32.
  ;;   q4 block (80 bytes): 16 nibble bytes per row (row 0..3; low nibble of byte j = column j,
  ;;     high nibble = column j + 16), then d[4] f16, then m[4] f16: w = q * d + m (Q4_1; Q4_0 is
  ;;     stored with m = -8 d, exact in f16). The f16 scales are widened in-kernel (exact for
  ;;     finite values), written out inline: V8 does not inline wasm calls.
  ;;   q8 block (144 bytes): 32 int8 per row (rows 0..3), then d[4] as f32 (the f16 of the file
  ;;     widened exactly at load: the block keeps Q8_0's 34 bytes per row plus 2): w = q * d (Q8_0).
  ;; Quantized input (quant_x) of T tokens in token quads: block b of token t at
  ;;   x + ((t >> 2) * nb + b) * 256 + (t & 3) * 64, 32 i16 in the order the kernels widen the
  ;;   weights: even columns 0-14, odd 1-15, even 16-30, odd 17-31 (in 16-bit lanes the low byte
  ;;   of a weight pair is the even column, the high byte the odd one: shifts, no shuffles); its scale dx and
  ;;   sx = dx * sum(q) (f32) at xs + ((t >> 2) * nb + b) * 32 + (t & 3) * 4 and + 16, where
  ;;   xs = x + ceil(T / 4) * nb * 256.
  ;; Per output, for blocks in column order:  isum = the exact integer sum of w_q * x_q over the
  ;; block (any association: integers; |isum| <= 32 * 128 * 32767 < 2^31, no overflow);
  ;; acc += f32(isum) * (d_w * dx) (f32(isum) rounds to nearest above 2^24, the same way
  ;; everywhere);  for q4 then
  ;; acc += m_w * sx.  Every tile repeats exactly these f32 operations per output, so a row alone,
  ;; in any token tile, or on either thread gives the same bits.

  ;; src f32 [T][cols] -> the quantized input layout above at dst. Per token and block:
  ;; amax = max |x|, dx = amax / 32767, q = nearest(x * (1 / dx)) (0 when dx = 0) in
  ;; [-32767, 32767], sx = dx * sum(q) (exact: |sum| < 2^21).
  (func (export "quant_x") (param $src i32) (param $dst i32) (param $T i32) (param $cols i32)
    (local $nb i32) (local $xsb i32) (local $t i32) (local $b i32) (local $p i32) (local $o i32) (local $so i32)
    (local $v0 v128) (local $v1 v128) (local $v2 v128) (local $v3 v128) (local $v4 v128) (local $v5 v128) (local $v6 v128) (local $v7 v128)
    (local $m v128) (local $vid v128) (local $amax f32) (local $d f32) (local $sum v128) (local $n0 v128) (local $n1 v128)
    (local $q0 v128) (local $q1 v128) (local $q2 v128) (local $q3 v128) (local $q4 v128) (local $q5 v128) (local $q6 v128) (local $q7 v128)
    (local.set $nb (i32.shr_u (local.get $cols) (i32.const 5)))
    (local.set $xsb (i32.add (local.get $dst) (i32.mul (i32.shr_u (i32.add (local.get $T) (i32.const 3)) (i32.const 2)) (i32.shl (local.get $nb) (i32.const 8)))))
    (local.set $p (local.get $src))
    (block $tokens_done (loop $token
      (br_if $tokens_done (i32.ge_u (local.get $t) (local.get $T)))
      (local.set $b (i32.const 0))
      (block $blocks_done (loop $block
        (br_if $blocks_done (i32.ge_u (local.get $b) (local.get $nb)))
        (local.set $v0 (v128.load offset=0 (local.get $p)))
        (local.set $v1 (v128.load offset=16 (local.get $p)))
        (local.set $v2 (v128.load offset=32 (local.get $p)))
        (local.set $v3 (v128.load offset=48 (local.get $p)))
        (local.set $v4 (v128.load offset=64 (local.get $p)))
        (local.set $v5 (v128.load offset=80 (local.get $p)))
        (local.set $v6 (v128.load offset=96 (local.get $p)))
        (local.set $v7 (v128.load offset=112 (local.get $p)))
        (local.set $m (f32x4.max
          (f32x4.max (f32x4.max (f32x4.abs (local.get $v0)) (f32x4.abs (local.get $v1))) (f32x4.max (f32x4.abs (local.get $v2)) (f32x4.abs (local.get $v3))))
          (f32x4.max (f32x4.max (f32x4.abs (local.get $v4)) (f32x4.abs (local.get $v5))) (f32x4.max (f32x4.abs (local.get $v6)) (f32x4.abs (local.get $v7))))))
        (local.set $amax (f32.max (f32.max (f32x4.extract_lane 0 (local.get $m)) (f32x4.extract_lane 1 (local.get $m)))
                                  (f32.max (f32x4.extract_lane 2 (local.get $m)) (f32x4.extract_lane 3 (local.get $m)))))
        (local.set $d (f32.div (local.get $amax) (f32.const 32767)))
        (local.set $vid (f32x4.splat (select (f32.div (f32.const 1) (local.get $d)) (f32.const 0) (f32.ne (local.get $d) (f32.const 0)))))
        (local.set $q0 (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (local.get $v0) (local.get $vid)))))
        (local.set $q1 (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (local.get $v1) (local.get $vid)))))
        (local.set $q2 (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (local.get $v2) (local.get $vid)))))
        (local.set $q3 (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (local.get $v3) (local.get $vid)))))
        (local.set $q4 (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (local.get $v4) (local.get $vid)))))
        (local.set $q5 (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (local.get $v5) (local.get $vid)))))
        (local.set $q6 (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (local.get $v6) (local.get $vid)))))
        (local.set $q7 (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (local.get $v7) (local.get $vid)))))
        (local.set $o (i32.add (i32.add (local.get $dst) (i32.shl (i32.add (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (local.get $nb)) (local.get $b)) (i32.const 8)))
                               (i32.shl (i32.and (local.get $t) (i32.const 3)) (i32.const 6))))
        ;; columns 0-15 as i16, then split into even and odd columns (the weights' order)
        (local.set $n0 (i16x8.narrow_i32x4_s (local.get $q0) (local.get $q1)))
        (local.set $n1 (i16x8.narrow_i32x4_s (local.get $q2) (local.get $q3)))
        (v128.store offset=0 (local.get $o) (i8x16.shuffle 0 1 4 5 8 9 12 13 16 17 20 21 24 25 28 29 (local.get $n0) (local.get $n1)))
        (v128.store offset=16 (local.get $o) (i8x16.shuffle 2 3 6 7 10 11 14 15 18 19 22 23 26 27 30 31 (local.get $n0) (local.get $n1)))
        (local.set $n0 (i16x8.narrow_i32x4_s (local.get $q4) (local.get $q5)))
        (local.set $n1 (i16x8.narrow_i32x4_s (local.get $q6) (local.get $q7)))
        (v128.store offset=32 (local.get $o) (i8x16.shuffle 0 1 4 5 8 9 12 13 16 17 20 21 24 25 28 29 (local.get $n0) (local.get $n1)))
        (v128.store offset=48 (local.get $o) (i8x16.shuffle 2 3 6 7 10 11 14 15 18 19 22 23 26 27 30 31 (local.get $n0) (local.get $n1)))
        (local.set $sum (i32x4.add (i32x4.add (i32x4.add (local.get $q0) (local.get $q1)) (i32x4.add (local.get $q2) (local.get $q3)))
                                   (i32x4.add (i32x4.add (local.get $q4) (local.get $q5)) (i32x4.add (local.get $q6) (local.get $q7)))))
        (local.set $so (i32.add (i32.add (local.get $xsb) (i32.shl (i32.add (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (local.get $nb)) (local.get $b)) (i32.const 5)))
                                (i32.shl (i32.and (local.get $t) (i32.const 3)) (i32.const 2))))
        (f32.store offset=0 (local.get $so) (local.get $d))
        (f32.store offset=16 (local.get $so) (f32.mul (local.get $d) (f32.convert_i32_s
          (i32.add (i32.add (i32x4.extract_lane 0 (local.get $sum)) (i32x4.extract_lane 1 (local.get $sum)))
                   (i32.add (i32x4.extract_lane 2 (local.get $sum)) (i32x4.extract_lane 3 (local.get $sum)))))))
        (local.set $p (i32.add (local.get $p) (i32.const 128)))
        (local.set $b (i32.add (local.get $b) (i32.const 1)))
        (br $block)))
      (local.set $t (i32.add (local.get $t) (i32.const 1)))
      (br $token))))

  ;; ---------------------------------------------------------------- q4: four rows x one token
  ;; $groups 4-row groups from $w (80 bytes per block of 32 columns), one token's quantized
  ;; input: block b at $x + 256 b (i16) and its scale/sum at $xs + 32 b; y[4g + r] at $y + 16 g.
  (func $q4_1t (param $w i32) (param $x i32) (param $xs i32) (param $y i32) (param $nb i32) (param $scr i32) (param $groups i32)
    (local $acc v128) (local $v v128) (local $lo v128) (local $hi v128) (local $x0 v128) (local $x1 v128) (local $x2 v128) (local $x3 v128)
    (local $s0 v128) (local $s1 v128) (local $s2 v128) (local $s3 v128) (local $ab v128) (local $cd v128) (local $is v128) (local $dm v128)
    (local $xb i32) (local $sb i32) (local $end i32) (local $yend i32)
    (local.set $yend (i32.add (local.get $y) (i32.shl (local.get $groups) (i32.const 4))))
    (block $all_done (loop $group
      (br_if $all_done (i32.ge_u (local.get $y) (local.get $yend)))
      (local.set $acc (v128.const i32x4 0 0 0 0))
      (local.set $xb (local.get $x))
      (local.set $sb (local.get $xs))
      (local.set $end (i32.add (local.get $w) (i32.mul (local.get $nb) (i32.const 80))))
      (loop $block
        (local.set $x0 (v128.load offset=0 (local.get $xb)))
        (local.set $x1 (v128.load offset=16 (local.get $xb)))
        (local.set $x2 (v128.load offset=32 (local.get $xb)))
        (local.set $x3 (v128.load offset=48 (local.get $xb)))
        (local.set $v (v128.load offset=0 (local.get $w)))
        (v128.store offset=0 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (v128.and (local.get $v) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x0)) (i32x4.dot_i16x8_s (v128.and (i16x8.shr_u (local.get $v) (i32.const 8)) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x1))) (i32x4.add (i32x4.dot_i16x8_s (v128.and (i16x8.shr_u (local.get $v) (i32.const 4)) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x2)) (i32x4.dot_i16x8_s (i16x8.shr_u (local.get $v) (i32.const 12)) (local.get $x3)))))
        (local.set $v (v128.load offset=16 (local.get $w)))
        (v128.store offset=16 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (v128.and (local.get $v) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x0)) (i32x4.dot_i16x8_s (v128.and (i16x8.shr_u (local.get $v) (i32.const 8)) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x1))) (i32x4.add (i32x4.dot_i16x8_s (v128.and (i16x8.shr_u (local.get $v) (i32.const 4)) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x2)) (i32x4.dot_i16x8_s (i16x8.shr_u (local.get $v) (i32.const 12)) (local.get $x3)))))
        (local.set $v (v128.load offset=32 (local.get $w)))
        (v128.store offset=32 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (v128.and (local.get $v) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x0)) (i32x4.dot_i16x8_s (v128.and (i16x8.shr_u (local.get $v) (i32.const 8)) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x1))) (i32x4.add (i32x4.dot_i16x8_s (v128.and (i16x8.shr_u (local.get $v) (i32.const 4)) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x2)) (i32x4.dot_i16x8_s (i16x8.shr_u (local.get $v) (i32.const 12)) (local.get $x3)))))
        (local.set $v (v128.load offset=48 (local.get $w)))
        (v128.store offset=48 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (v128.and (local.get $v) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x0)) (i32x4.dot_i16x8_s (v128.and (i16x8.shr_u (local.get $v) (i32.const 8)) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x1))) (i32x4.add (i32x4.dot_i16x8_s (v128.and (i16x8.shr_u (local.get $v) (i32.const 4)) (v128.const i16x8 15 15 15 15 15 15 15 15)) (local.get $x2)) (i32x4.dot_i16x8_s (i16x8.shr_u (local.get $v) (i32.const 12)) (local.get $x3)))))
        (local.set $s0 (v128.load offset=0 (local.get $scr)))
        (local.set $s1 (v128.load offset=16 (local.get $scr)))
        (local.set $s2 (v128.load offset=32 (local.get $scr)))
        (local.set $s3 (v128.load offset=48 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $dm (v128.load offset=64 (local.get $w)))
        (local.set $acc (f32x4.add (local.get $acc) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is))
          (f32x4.mul (v128.or (f32x4.mul (i32x4.shl (v128.and (i32x4.extend_low_i16x8_u (local.get $dm)) (v128.const i32x4 0x7fff 0x7fff 0x7fff 0x7fff)) (i32.const 13)) (v128.const f32x4 0x1p112 0x1p112 0x1p112 0x1p112)) (i32x4.shl (v128.and (i32x4.extend_low_i16x8_u (local.get $dm)) (v128.const i32x4 0x8000 0x8000 0x8000 0x8000)) (i32.const 16))) (f32x4.splat (f32.load (local.get $sb)))))))
        (local.set $acc (f32x4.add (local.get $acc) (f32x4.mul (v128.or (f32x4.mul (i32x4.shl (v128.and (i32x4.extend_high_i16x8_u (local.get $dm)) (v128.const i32x4 0x7fff 0x7fff 0x7fff 0x7fff)) (i32.const 13)) (v128.const f32x4 0x1p112 0x1p112 0x1p112 0x1p112)) (i32x4.shl (v128.and (i32x4.extend_high_i16x8_u (local.get $dm)) (v128.const i32x4 0x8000 0x8000 0x8000 0x8000)) (i32.const 16))) (f32x4.splat (f32.load offset=16 (local.get $sb))))))
        (local.set $xb (i32.add (local.get $xb) (i32.const 256)))
        (local.set $sb (i32.add (local.get $sb) (i32.const 32)))
        (br_if $block (i32.lt_u (local.tee $w (i32.add (local.get $w) (i32.const 80))) (local.get $end))))
      (v128.store (local.get $y) (local.get $acc))
      (local.set $y (i32.add (local.get $y) (i32.const 16)))
      (br $group))))

  ;; ---------------------------------------------------------------- q4: four rows x four tokens
  ;; As q4_1t for a token quad ($x, $xs: the quad's blocks; token t at +64 t and +4 t): each
  ;; row's 32 weights are widened once per block and used by the 4 tokens; the (row, token) sums
  ;; go through $scr (bytes 0-255) and the 4 accumulators live at $scr + 256 (the stores keep V8
  ;; from hoisting every load to the top of the block and spilling), then
  ;; per token the same integer sums, scale products and f32 adds in the same order as q4_1t.
  (func $q4_4t (param $w i32) (param $x i32) (param $xs i32) (param $y i32) (param $nb i32) (param $ys i32) (param $scr i32) (param $groups i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128) (local $v v128) (local $lo v128) (local $hi v128)
    (local $w0 v128) (local $w1 v128) (local $w2 v128) (local $w3 v128)
    (local $s0 v128) (local $s1 v128) (local $s2 v128) (local $s3 v128) (local $ab v128) (local $cd v128) (local $is v128)
    (local $dw v128) (local $mw v128) (local $dx v128) (local $sx v128)
    (local $xb i32) (local $sb i32) (local $end i32) (local $yend i32)
    (local.set $yend (i32.add (local.get $y) (i32.shl (local.get $groups) (i32.const 4))))
    (block $all_done (loop $group
      (br_if $all_done (i32.ge_u (local.get $y) (local.get $yend)))
      (v128.store offset=256 (local.get $scr) (v128.const i32x4 0 0 0 0))
      (v128.store offset=272 (local.get $scr) (v128.const i32x4 0 0 0 0))
      (v128.store offset=288 (local.get $scr) (v128.const i32x4 0 0 0 0))
      (v128.store offset=304 (local.get $scr) (v128.const i32x4 0 0 0 0))
      (local.set $xb (local.get $x))
      (local.set $sb (local.get $xs))
      (local.set $end (i32.add (local.get $w) (i32.mul (local.get $nb) (i32.const 80))))
      (loop $block
        (local.set $v (v128.load offset=0 (local.get $w)))
        (local.set $w0 (v128.and (local.get $v) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w1 (v128.and (i16x8.shr_u (local.get $v) (i32.const 8)) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w2 (v128.and (i16x8.shr_u (local.get $v) (i32.const 4)) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w3 (i16x8.shr_u (local.get $v) (i32.const 12)))
        (v128.store offset=0 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=0 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=16 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=32 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=48 (local.get $xb))))))
        (v128.store offset=64 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=64 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=80 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=96 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=112 (local.get $xb))))))
        (v128.store offset=128 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=128 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=144 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=160 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=176 (local.get $xb))))))
        (v128.store offset=192 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=192 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=208 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=224 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=240 (local.get $xb))))))
        (local.set $v (v128.load offset=16 (local.get $w)))
        (local.set $w0 (v128.and (local.get $v) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w1 (v128.and (i16x8.shr_u (local.get $v) (i32.const 8)) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w2 (v128.and (i16x8.shr_u (local.get $v) (i32.const 4)) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w3 (i16x8.shr_u (local.get $v) (i32.const 12)))
        (v128.store offset=16 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=0 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=16 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=32 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=48 (local.get $xb))))))
        (v128.store offset=80 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=64 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=80 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=96 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=112 (local.get $xb))))))
        (v128.store offset=144 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=128 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=144 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=160 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=176 (local.get $xb))))))
        (v128.store offset=208 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=192 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=208 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=224 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=240 (local.get $xb))))))
        (local.set $v (v128.load offset=32 (local.get $w)))
        (local.set $w0 (v128.and (local.get $v) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w1 (v128.and (i16x8.shr_u (local.get $v) (i32.const 8)) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w2 (v128.and (i16x8.shr_u (local.get $v) (i32.const 4)) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w3 (i16x8.shr_u (local.get $v) (i32.const 12)))
        (v128.store offset=32 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=0 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=16 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=32 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=48 (local.get $xb))))))
        (v128.store offset=96 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=64 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=80 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=96 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=112 (local.get $xb))))))
        (v128.store offset=160 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=128 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=144 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=160 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=176 (local.get $xb))))))
        (v128.store offset=224 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=192 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=208 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=224 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=240 (local.get $xb))))))
        (local.set $v (v128.load offset=48 (local.get $w)))
        (local.set $w0 (v128.and (local.get $v) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w1 (v128.and (i16x8.shr_u (local.get $v) (i32.const 8)) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w2 (v128.and (i16x8.shr_u (local.get $v) (i32.const 4)) (v128.const i16x8 15 15 15 15 15 15 15 15)))
        (local.set $w3 (i16x8.shr_u (local.get $v) (i32.const 12)))
        (v128.store offset=48 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=0 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=16 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=32 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=48 (local.get $xb))))))
        (v128.store offset=112 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=64 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=80 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=96 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=112 (local.get $xb))))))
        (v128.store offset=176 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=128 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=144 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=160 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=176 (local.get $xb))))))
        (v128.store offset=240 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=192 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=208 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=224 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=240 (local.get $xb))))))
        (local.set $v (v128.load offset=64 (local.get $w)))
        (local.set $dw (v128.or (f32x4.mul (i32x4.shl (v128.and (i32x4.extend_low_i16x8_u (local.get $v)) (v128.const i32x4 0x7fff 0x7fff 0x7fff 0x7fff)) (i32.const 13)) (v128.const f32x4 0x1p112 0x1p112 0x1p112 0x1p112)) (i32x4.shl (v128.and (i32x4.extend_low_i16x8_u (local.get $v)) (v128.const i32x4 0x8000 0x8000 0x8000 0x8000)) (i32.const 16))))
        (local.set $mw (v128.or (f32x4.mul (i32x4.shl (v128.and (i32x4.extend_high_i16x8_u (local.get $v)) (v128.const i32x4 0x7fff 0x7fff 0x7fff 0x7fff)) (i32.const 13)) (v128.const f32x4 0x1p112 0x1p112 0x1p112 0x1p112)) (i32x4.shl (v128.and (i32x4.extend_high_i16x8_u (local.get $v)) (v128.const i32x4 0x8000 0x8000 0x8000 0x8000)) (i32.const 16))))
        (local.set $dx (v128.load offset=0 (local.get $sb)))
        (local.set $sx (v128.load offset=16 (local.get $sb)))
        (local.set $s0 (v128.load offset=0 (local.get $scr)))
        (local.set $s1 (v128.load offset=16 (local.get $scr)))
        (local.set $s2 (v128.load offset=32 (local.get $scr)))
        (local.set $s3 (v128.load offset=48 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $a0 (f32x4.add (v128.load offset=256 (local.get $scr)) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is)) (f32x4.mul (local.get $dw) (f32x4.splat (f32x4.extract_lane 0 (local.get $dx)))))))
        (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $mw) (f32x4.splat (f32x4.extract_lane 0 (local.get $sx))))))
        (v128.store offset=256 (local.get $scr) (local.get $a0))
        (local.set $s0 (v128.load offset=64 (local.get $scr)))
        (local.set $s1 (v128.load offset=80 (local.get $scr)))
        (local.set $s2 (v128.load offset=96 (local.get $scr)))
        (local.set $s3 (v128.load offset=112 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $a0 (f32x4.add (v128.load offset=272 (local.get $scr)) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is)) (f32x4.mul (local.get $dw) (f32x4.splat (f32x4.extract_lane 1 (local.get $dx)))))))
        (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $mw) (f32x4.splat (f32x4.extract_lane 1 (local.get $sx))))))
        (v128.store offset=272 (local.get $scr) (local.get $a0))
        (local.set $s0 (v128.load offset=128 (local.get $scr)))
        (local.set $s1 (v128.load offset=144 (local.get $scr)))
        (local.set $s2 (v128.load offset=160 (local.get $scr)))
        (local.set $s3 (v128.load offset=176 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $a0 (f32x4.add (v128.load offset=288 (local.get $scr)) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is)) (f32x4.mul (local.get $dw) (f32x4.splat (f32x4.extract_lane 2 (local.get $dx)))))))
        (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $mw) (f32x4.splat (f32x4.extract_lane 2 (local.get $sx))))))
        (v128.store offset=288 (local.get $scr) (local.get $a0))
        (local.set $s0 (v128.load offset=192 (local.get $scr)))
        (local.set $s1 (v128.load offset=208 (local.get $scr)))
        (local.set $s2 (v128.load offset=224 (local.get $scr)))
        (local.set $s3 (v128.load offset=240 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $a0 (f32x4.add (v128.load offset=304 (local.get $scr)) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is)) (f32x4.mul (local.get $dw) (f32x4.splat (f32x4.extract_lane 3 (local.get $dx)))))))
        (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $mw) (f32x4.splat (f32x4.extract_lane 3 (local.get $sx))))))
        (v128.store offset=304 (local.get $scr) (local.get $a0))
        (local.set $xb (i32.add (local.get $xb) (i32.const 256)))
        (local.set $sb (i32.add (local.get $sb) (i32.const 32)))
        (br_if $block (i32.lt_u (local.tee $w (i32.add (local.get $w) (i32.const 80))) (local.get $end))))
      (v128.store (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 0))) (v128.load offset=256 (local.get $scr)))
      (v128.store (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 1))) (v128.load offset=272 (local.get $scr)))
      (v128.store (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 2))) (v128.load offset=288 (local.get $scr)))
      (v128.store (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 3))) (v128.load offset=304 (local.get $scr)))
      (local.set $y (i32.add (local.get $y) (i32.const 16)))
      (br $group))))

  ;; ---------------------------------------------------------------- q4 matmul driver
  ;; Y[t][r] = W[r] . X[t] for rows [r0, r1) (multiples of 4) of a q4 image at $w and an input
  ;; quantized by quant_x at $x; chunks of 32 rows, token quads, then single tokens.
  (func (export "matmul_q4") (param $w i32) (param $x i32) (param $y i32) (param $T i32)
        (param $cols i32) (param $rows i32) (param $r0 i32) (param $r1 i32) (param $scr i32)
    (local $nb i32) (local $gb i32) (local $xsb i32) (local $ys i32) (local $tq i32) (local $t i32) (local $rb i32) (local $re i32) (local $q i32) (local $wg i32)
    (local.set $nb (i32.shr_u (local.get $cols) (i32.const 5)))
    (local.set $gb (i32.mul (local.get $nb) (i32.const 80)))
    (local.set $xsb (i32.add (local.get $x) (i32.mul (i32.shr_u (i32.add (local.get $T) (i32.const 3)) (i32.const 2)) (i32.shl (local.get $nb) (i32.const 8)))))
    (local.set $ys (i32.shl (local.get $rows) (i32.const 2)))
    (local.set $tq (i32.and (local.get $T) (i32.const -4)))
    (local.set $rb (local.get $r0))
    (block $rows_done (loop $row_chunk
      (br_if $rows_done (i32.ge_u (local.get $rb) (local.get $r1)))
      (local.set $re (i32.add (local.get $rb) (i32.const 32)))
      (if (i32.gt_u (local.get $re) (local.get $r1)) (then (local.set $re (local.get $r1))))
      (local.set $wg (i32.add (local.get $w) (i32.mul (i32.shr_u (local.get $rb) (i32.const 2)) (local.get $gb))))
      (local.set $t (i32.const 0))
      (block $quads_done (loop $quad
        (br_if $quads_done (i32.ge_u (local.get $t) (local.get $tq)))
        (local.set $q (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (local.get $nb)))
        (call $q4_4t (local.get $wg) (i32.add (local.get $x) (i32.shl (local.get $q) (i32.const 8))) (i32.add (local.get $xsb) (i32.shl (local.get $q) (i32.const 5)))
          (i32.add (i32.add (local.get $y) (i32.mul (local.get $t) (local.get $ys))) (i32.shl (local.get $rb) (i32.const 2))) (local.get $nb) (local.get $ys) (local.get $scr) (i32.shr_u (i32.sub (local.get $re) (local.get $rb)) (i32.const 2)))
        (local.set $t (i32.add (local.get $t) (i32.const 4)))
        (br $quad)))
      (block $singles_done (loop $single
        (br_if $singles_done (i32.ge_u (local.get $t) (local.get $T)))
        (local.set $q (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (local.get $nb)))
        (call $q4_1t (local.get $wg)
          (i32.add (i32.add (local.get $x) (i32.shl (local.get $q) (i32.const 8))) (i32.shl (i32.and (local.get $t) (i32.const 3)) (i32.const 6)))
          (i32.add (i32.add (local.get $xsb) (i32.shl (local.get $q) (i32.const 5))) (i32.shl (i32.and (local.get $t) (i32.const 3)) (i32.const 2)))
          (i32.add (i32.add (local.get $y) (i32.mul (local.get $t) (local.get $ys))) (i32.shl (local.get $rb) (i32.const 2))) (local.get $nb) (local.get $scr) (i32.shr_u (i32.sub (local.get $re) (local.get $rb)) (i32.const 2)))
        (local.set $t (i32.add (local.get $t) (i32.const 1)))
        (br $single)))
      (local.set $rb (local.get $re))
      (br $row_chunk))))

  ;; ---------------------------------------------------------------- q8: four rows x one token
  ;; $groups 4-row groups from $w (144 bytes per block of 32 columns), one token's quantized
  ;; input: block b at $x + 256 b (i16) and its scale at $xs + 32 b; y[4g + r] at $y + 16 g.
  (func $q8_1t (param $w i32) (param $x i32) (param $xs i32) (param $y i32) (param $nb i32) (param $scr i32) (param $groups i32)
    (local $acc v128) (local $v v128) (local $lo v128) (local $hi v128) (local $x0 v128) (local $x1 v128) (local $x2 v128) (local $x3 v128)
    (local $s0 v128) (local $s1 v128) (local $s2 v128) (local $s3 v128) (local $ab v128) (local $cd v128) (local $is v128) (local $dm v128)
    (local $xb i32) (local $sb i32) (local $end i32) (local $yend i32)
    (local.set $yend (i32.add (local.get $y) (i32.shl (local.get $groups) (i32.const 4))))
    (block $all_done (loop $group
      (br_if $all_done (i32.ge_u (local.get $y) (local.get $yend)))
      (local.set $acc (v128.const i32x4 0 0 0 0))
      (local.set $xb (local.get $x))
      (local.set $sb (local.get $xs))
      (local.set $end (i32.add (local.get $w) (i32.mul (local.get $nb) (i32.const 144))))
      (loop $block
        (local.set $x0 (v128.load offset=0 (local.get $xb)))
        (local.set $x1 (v128.load offset=16 (local.get $xb)))
        (local.set $x2 (v128.load offset=32 (local.get $xb)))
        (local.set $x3 (v128.load offset=48 (local.get $xb)))
        (local.set $lo (v128.load offset=0 (local.get $w)))
        (local.set $hi (v128.load offset=16 (local.get $w)))
        (v128.store offset=0 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (i16x8.shr_s (i16x8.shl (local.get $lo) (i32.const 8)) (i32.const 8)) (local.get $x0)) (i32x4.dot_i16x8_s (i16x8.shr_s (local.get $lo) (i32.const 8)) (local.get $x1))) (i32x4.add (i32x4.dot_i16x8_s (i16x8.shr_s (i16x8.shl (local.get $hi) (i32.const 8)) (i32.const 8)) (local.get $x2)) (i32x4.dot_i16x8_s (i16x8.shr_s (local.get $hi) (i32.const 8)) (local.get $x3)))))
        (local.set $lo (v128.load offset=32 (local.get $w)))
        (local.set $hi (v128.load offset=48 (local.get $w)))
        (v128.store offset=16 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (i16x8.shr_s (i16x8.shl (local.get $lo) (i32.const 8)) (i32.const 8)) (local.get $x0)) (i32x4.dot_i16x8_s (i16x8.shr_s (local.get $lo) (i32.const 8)) (local.get $x1))) (i32x4.add (i32x4.dot_i16x8_s (i16x8.shr_s (i16x8.shl (local.get $hi) (i32.const 8)) (i32.const 8)) (local.get $x2)) (i32x4.dot_i16x8_s (i16x8.shr_s (local.get $hi) (i32.const 8)) (local.get $x3)))))
        (local.set $lo (v128.load offset=64 (local.get $w)))
        (local.set $hi (v128.load offset=80 (local.get $w)))
        (v128.store offset=32 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (i16x8.shr_s (i16x8.shl (local.get $lo) (i32.const 8)) (i32.const 8)) (local.get $x0)) (i32x4.dot_i16x8_s (i16x8.shr_s (local.get $lo) (i32.const 8)) (local.get $x1))) (i32x4.add (i32x4.dot_i16x8_s (i16x8.shr_s (i16x8.shl (local.get $hi) (i32.const 8)) (i32.const 8)) (local.get $x2)) (i32x4.dot_i16x8_s (i16x8.shr_s (local.get $hi) (i32.const 8)) (local.get $x3)))))
        (local.set $lo (v128.load offset=96 (local.get $w)))
        (local.set $hi (v128.load offset=112 (local.get $w)))
        (v128.store offset=48 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (i16x8.shr_s (i16x8.shl (local.get $lo) (i32.const 8)) (i32.const 8)) (local.get $x0)) (i32x4.dot_i16x8_s (i16x8.shr_s (local.get $lo) (i32.const 8)) (local.get $x1))) (i32x4.add (i32x4.dot_i16x8_s (i16x8.shr_s (i16x8.shl (local.get $hi) (i32.const 8)) (i32.const 8)) (local.get $x2)) (i32x4.dot_i16x8_s (i16x8.shr_s (local.get $hi) (i32.const 8)) (local.get $x3)))))
        (local.set $s0 (v128.load offset=0 (local.get $scr)))
        (local.set $s1 (v128.load offset=16 (local.get $scr)))
        (local.set $s2 (v128.load offset=32 (local.get $scr)))
        (local.set $s3 (v128.load offset=48 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $dm (v128.load offset=128 (local.get $w)))
        (local.set $acc (f32x4.add (local.get $acc) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is))
          (f32x4.mul (local.get $dm) (f32x4.splat (f32.load (local.get $sb)))))))
        (local.set $xb (i32.add (local.get $xb) (i32.const 256)))
        (local.set $sb (i32.add (local.get $sb) (i32.const 32)))
        (br_if $block (i32.lt_u (local.tee $w (i32.add (local.get $w) (i32.const 144))) (local.get $end))))
      (v128.store (local.get $y) (local.get $acc))
      (local.set $y (i32.add (local.get $y) (i32.const 16)))
      (br $group))))

  ;; ---------------------------------------------------------------- q8: four rows x four tokens
  ;; As q8_1t for a token quad ($x, $xs: the quad's blocks; token t at +64 t and +4 t): each
  ;; row's 32 weights are widened once per block and used by the 4 tokens; the (row, token) sums
  ;; go through $scr (bytes 0-255) and the 4 accumulators live at $scr + 256 (the stores keep V8
  ;; from hoisting every load to the top of the block and spilling), then
  ;; per token the same integer sums, scale products and f32 adds in the same order as q8_1t.
  (func $q8_4t (param $w i32) (param $x i32) (param $xs i32) (param $y i32) (param $nb i32) (param $ys i32) (param $scr i32) (param $groups i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128) (local $v v128) (local $lo v128) (local $hi v128)
    (local $w0 v128) (local $w1 v128) (local $w2 v128) (local $w3 v128)
    (local $s0 v128) (local $s1 v128) (local $s2 v128) (local $s3 v128) (local $ab v128) (local $cd v128) (local $is v128)
    (local $dw v128) (local $mw v128) (local $dx v128) (local $sx v128)
    (local $xb i32) (local $sb i32) (local $end i32) (local $yend i32)
    (local.set $yend (i32.add (local.get $y) (i32.shl (local.get $groups) (i32.const 4))))
    (block $all_done (loop $group
      (br_if $all_done (i32.ge_u (local.get $y) (local.get $yend)))
      (v128.store offset=256 (local.get $scr) (v128.const i32x4 0 0 0 0))
      (v128.store offset=272 (local.get $scr) (v128.const i32x4 0 0 0 0))
      (v128.store offset=288 (local.get $scr) (v128.const i32x4 0 0 0 0))
      (v128.store offset=304 (local.get $scr) (v128.const i32x4 0 0 0 0))
      (local.set $xb (local.get $x))
      (local.set $sb (local.get $xs))
      (local.set $end (i32.add (local.get $w) (i32.mul (local.get $nb) (i32.const 144))))
      (loop $block
        (local.set $lo (v128.load offset=0 (local.get $w)))
        (local.set $hi (v128.load offset=16 (local.get $w)))
        (local.set $w0 (i16x8.shr_s (i16x8.shl (local.get $lo) (i32.const 8)) (i32.const 8)))
        (local.set $w1 (i16x8.shr_s (local.get $lo) (i32.const 8)))
        (local.set $w2 (i16x8.shr_s (i16x8.shl (local.get $hi) (i32.const 8)) (i32.const 8)))
        (local.set $w3 (i16x8.shr_s (local.get $hi) (i32.const 8)))
        (v128.store offset=0 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=0 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=16 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=32 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=48 (local.get $xb))))))
        (v128.store offset=64 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=64 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=80 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=96 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=112 (local.get $xb))))))
        (v128.store offset=128 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=128 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=144 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=160 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=176 (local.get $xb))))))
        (v128.store offset=192 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=192 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=208 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=224 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=240 (local.get $xb))))))
        (local.set $lo (v128.load offset=32 (local.get $w)))
        (local.set $hi (v128.load offset=48 (local.get $w)))
        (local.set $w0 (i16x8.shr_s (i16x8.shl (local.get $lo) (i32.const 8)) (i32.const 8)))
        (local.set $w1 (i16x8.shr_s (local.get $lo) (i32.const 8)))
        (local.set $w2 (i16x8.shr_s (i16x8.shl (local.get $hi) (i32.const 8)) (i32.const 8)))
        (local.set $w3 (i16x8.shr_s (local.get $hi) (i32.const 8)))
        (v128.store offset=16 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=0 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=16 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=32 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=48 (local.get $xb))))))
        (v128.store offset=80 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=64 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=80 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=96 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=112 (local.get $xb))))))
        (v128.store offset=144 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=128 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=144 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=160 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=176 (local.get $xb))))))
        (v128.store offset=208 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=192 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=208 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=224 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=240 (local.get $xb))))))
        (local.set $lo (v128.load offset=64 (local.get $w)))
        (local.set $hi (v128.load offset=80 (local.get $w)))
        (local.set $w0 (i16x8.shr_s (i16x8.shl (local.get $lo) (i32.const 8)) (i32.const 8)))
        (local.set $w1 (i16x8.shr_s (local.get $lo) (i32.const 8)))
        (local.set $w2 (i16x8.shr_s (i16x8.shl (local.get $hi) (i32.const 8)) (i32.const 8)))
        (local.set $w3 (i16x8.shr_s (local.get $hi) (i32.const 8)))
        (v128.store offset=32 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=0 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=16 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=32 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=48 (local.get $xb))))))
        (v128.store offset=96 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=64 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=80 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=96 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=112 (local.get $xb))))))
        (v128.store offset=160 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=128 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=144 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=160 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=176 (local.get $xb))))))
        (v128.store offset=224 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=192 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=208 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=224 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=240 (local.get $xb))))))
        (local.set $lo (v128.load offset=96 (local.get $w)))
        (local.set $hi (v128.load offset=112 (local.get $w)))
        (local.set $w0 (i16x8.shr_s (i16x8.shl (local.get $lo) (i32.const 8)) (i32.const 8)))
        (local.set $w1 (i16x8.shr_s (local.get $lo) (i32.const 8)))
        (local.set $w2 (i16x8.shr_s (i16x8.shl (local.get $hi) (i32.const 8)) (i32.const 8)))
        (local.set $w3 (i16x8.shr_s (local.get $hi) (i32.const 8)))
        (v128.store offset=48 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=0 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=16 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=32 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=48 (local.get $xb))))))
        (v128.store offset=112 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=64 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=80 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=96 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=112 (local.get $xb))))))
        (v128.store offset=176 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=128 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=144 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=160 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=176 (local.get $xb))))))
        (v128.store offset=240 (local.get $scr) (i32x4.add (i32x4.add (i32x4.dot_i16x8_s (local.get $w0) (v128.load offset=192 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w1) (v128.load offset=208 (local.get $xb)))) (i32x4.add (i32x4.dot_i16x8_s (local.get $w2) (v128.load offset=224 (local.get $xb))) (i32x4.dot_i16x8_s (local.get $w3) (v128.load offset=240 (local.get $xb))))))
        (local.set $v (v128.load offset=128 (local.get $w)))
        (local.set $dw (local.get $v))
        (local.set $dx (v128.load offset=0 (local.get $sb)))
        (local.set $s0 (v128.load offset=0 (local.get $scr)))
        (local.set $s1 (v128.load offset=16 (local.get $scr)))
        (local.set $s2 (v128.load offset=32 (local.get $scr)))
        (local.set $s3 (v128.load offset=48 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $a0 (f32x4.add (v128.load offset=256 (local.get $scr)) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is)) (f32x4.mul (local.get $dw) (f32x4.splat (f32x4.extract_lane 0 (local.get $dx)))))))
        (v128.store offset=256 (local.get $scr) (local.get $a0))
        (local.set $s0 (v128.load offset=64 (local.get $scr)))
        (local.set $s1 (v128.load offset=80 (local.get $scr)))
        (local.set $s2 (v128.load offset=96 (local.get $scr)))
        (local.set $s3 (v128.load offset=112 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $a0 (f32x4.add (v128.load offset=272 (local.get $scr)) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is)) (f32x4.mul (local.get $dw) (f32x4.splat (f32x4.extract_lane 1 (local.get $dx)))))))
        (v128.store offset=272 (local.get $scr) (local.get $a0))
        (local.set $s0 (v128.load offset=128 (local.get $scr)))
        (local.set $s1 (v128.load offset=144 (local.get $scr)))
        (local.set $s2 (v128.load offset=160 (local.get $scr)))
        (local.set $s3 (v128.load offset=176 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $a0 (f32x4.add (v128.load offset=288 (local.get $scr)) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is)) (f32x4.mul (local.get $dw) (f32x4.splat (f32x4.extract_lane 2 (local.get $dx)))))))
        (v128.store offset=288 (local.get $scr) (local.get $a0))
        (local.set $s0 (v128.load offset=192 (local.get $scr)))
        (local.set $s1 (v128.load offset=208 (local.get $scr)))
        (local.set $s2 (v128.load offset=224 (local.get $scr)))
        (local.set $s3 (v128.load offset=240 (local.get $scr)))
        (local.set $ab (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $cd (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $is (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $ab) (local.get $cd)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $ab) (local.get $cd))))
        (local.set $a0 (f32x4.add (v128.load offset=304 (local.get $scr)) (f32x4.mul (f32x4.convert_i32x4_s (local.get $is)) (f32x4.mul (local.get $dw) (f32x4.splat (f32x4.extract_lane 3 (local.get $dx)))))))
        (v128.store offset=304 (local.get $scr) (local.get $a0))
        (local.set $xb (i32.add (local.get $xb) (i32.const 256)))
        (local.set $sb (i32.add (local.get $sb) (i32.const 32)))
        (br_if $block (i32.lt_u (local.tee $w (i32.add (local.get $w) (i32.const 144))) (local.get $end))))
      (v128.store (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 0))) (v128.load offset=256 (local.get $scr)))
      (v128.store (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 1))) (v128.load offset=272 (local.get $scr)))
      (v128.store (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 2))) (v128.load offset=288 (local.get $scr)))
      (v128.store (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const 3))) (v128.load offset=304 (local.get $scr)))
      (local.set $y (i32.add (local.get $y) (i32.const 16)))
      (br $group))))

  ;; ---------------------------------------------------------------- q8 matmul driver
  ;; Y[t][r] = W[r] . X[t] for rows [r0, r1) (multiples of 4) of a q8 image at $w and an input
  ;; quantized by quant_x at $x; chunks of 32 rows, token quads, then single tokens.
  (func (export "matmul_q8") (param $w i32) (param $x i32) (param $y i32) (param $T i32)
        (param $cols i32) (param $rows i32) (param $r0 i32) (param $r1 i32) (param $scr i32)
    (local $nb i32) (local $gb i32) (local $xsb i32) (local $ys i32) (local $tq i32) (local $t i32) (local $rb i32) (local $re i32) (local $q i32) (local $wg i32)
    (local.set $nb (i32.shr_u (local.get $cols) (i32.const 5)))
    (local.set $gb (i32.mul (local.get $nb) (i32.const 144)))
    (local.set $xsb (i32.add (local.get $x) (i32.mul (i32.shr_u (i32.add (local.get $T) (i32.const 3)) (i32.const 2)) (i32.shl (local.get $nb) (i32.const 8)))))
    (local.set $ys (i32.shl (local.get $rows) (i32.const 2)))
    (local.set $tq (i32.and (local.get $T) (i32.const -4)))
    (local.set $rb (local.get $r0))
    (block $rows_done (loop $row_chunk
      (br_if $rows_done (i32.ge_u (local.get $rb) (local.get $r1)))
      (local.set $re (i32.add (local.get $rb) (i32.const 32)))
      (if (i32.gt_u (local.get $re) (local.get $r1)) (then (local.set $re (local.get $r1))))
      (local.set $wg (i32.add (local.get $w) (i32.mul (i32.shr_u (local.get $rb) (i32.const 2)) (local.get $gb))))
      (local.set $t (i32.const 0))
      (block $quads_done (loop $quad
        (br_if $quads_done (i32.ge_u (local.get $t) (local.get $tq)))
        (local.set $q (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (local.get $nb)))
        (call $q8_4t (local.get $wg) (i32.add (local.get $x) (i32.shl (local.get $q) (i32.const 8))) (i32.add (local.get $xsb) (i32.shl (local.get $q) (i32.const 5)))
          (i32.add (i32.add (local.get $y) (i32.mul (local.get $t) (local.get $ys))) (i32.shl (local.get $rb) (i32.const 2))) (local.get $nb) (local.get $ys) (local.get $scr) (i32.shr_u (i32.sub (local.get $re) (local.get $rb)) (i32.const 2)))
        (local.set $t (i32.add (local.get $t) (i32.const 4)))
        (br $quad)))
      (block $singles_done (loop $single
        (br_if $singles_done (i32.ge_u (local.get $t) (local.get $T)))
        (local.set $q (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (local.get $nb)))
        (call $q8_1t (local.get $wg)
          (i32.add (i32.add (local.get $x) (i32.shl (local.get $q) (i32.const 8))) (i32.shl (i32.and (local.get $t) (i32.const 3)) (i32.const 6)))
          (i32.add (i32.add (local.get $xsb) (i32.shl (local.get $q) (i32.const 5))) (i32.shl (i32.and (local.get $t) (i32.const 3)) (i32.const 2)))
          (i32.add (i32.add (local.get $y) (i32.mul (local.get $t) (local.get $ys))) (i32.shl (local.get $rb) (i32.const 2))) (local.get $nb) (local.get $scr) (i32.shr_u (i32.sub (local.get $re) (local.get $rb)) (i32.const 2)))
        (local.set $t (i32.add (local.get $t) (i32.const 1)))
        (br $single)))
      (local.set $rb (local.get $re))
      (br $row_chunk))))

)
