#!/usr/bin/env bash
# Convert the ImageNet training images to the HDF5 layout (docs/data.md).
#
#   examples/cluster/prepare_imagenet.sh /data/imagenet/train /data/imagenet/imagenet256.h5
#
# SRC holds one folder per class (n01440764/, ...). Images are resized to cover
# 256x256 and centre-cropped (stored uint8, about 250 GB uncompressed); the
# trainer takes random-resized 224 crops from them, and at validation resizes
# to 256 and takes the centre 224 (crop = 224 in the configs).
#
# The converter splits one folder: --val-fraction 0.04 holds out 4% of every
# class (about 51k images, the size of the official val set). It cannot put
# the official val folder into the val split; those numbers are therefore not
# directly comparable with the paper's.
set -euo pipefail
SRC=${1:?usage: prepare_imagenet.sh SRC_DIR OUT.h5}
OUT=${2:?usage: prepare_imagenet.sh SRC_DIR OUT.h5}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-$(cd "$HERE/../.." && pwd)/.venv}
exec "$VENV/bin/theanompi-ext" convert "$SRC" "$OUT" --size 256 --val-fraction 0.04 --seed 0
