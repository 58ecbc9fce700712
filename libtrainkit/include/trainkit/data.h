#pragma once
/// @file
/// Data: batches and the sources the Trainer reads them from (preloaded tensors, worker threads,
/// torch::data loaders, callables, on-device preprocessing), image transforms, IDX and CIFAR-10 readers,
/// and text: the basic_english tokenizer, a vocabulary, padded sequence batches, fortunes/aclImdb readers.
#include "trainkit/data/batch.h"
#include "trainkit/data/batch_source.h"
#include "trainkit/data/device_source.h"
#include "trainkit/data/cifar.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/parallel_loader.h"
#include "trainkit/data/sampler.h"
#include "trainkit/data/sequence_loader.h"
#include "trainkit/data/tensor_loader.h"
#include "trainkit/data/text_datasets.h"
#include "trainkit/data/tokenizer.h"
#include "trainkit/data/torch_data.h"
#include "trainkit/data/transforms.h"
#include "trainkit/data/vocab.h"
