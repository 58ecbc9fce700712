#pragma once
/// @file
/// Reference models (CNN, MLP, ResNets, LSTM and bag-of-words text classifiers), activation checkpointing, initialization.
#include "trainkit/nn/activation_checkpoint.h"
#include "trainkit/nn/init.h"
#include "trainkit/nn/models.h"
#include "trainkit/nn/resnet.h"
#include "trainkit/nn/text_classifier.h"
