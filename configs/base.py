"""The shared protocol: NT-Xent (tau 0.1), the small CNN, Fashion-MNIST, CPU.

Every configs/<method>.py is this plus one method; configs/default.py is
this plus the recipe chosen on validation. What each value is: docs/configs.md, "The shared protocol".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/base.py --workdir=workdir/base

Not measured as it stands: study v2 runs its arms from this protocol
with a shared recipe (studies/v2/REPORT.md); configs/default.py is it
with that recipe, measured.
"""

import ml_collections

from contrastive_jax.methods import memory_bank
from contrastive_jax.methods import moco


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.dataset = ml_collections.ConfigDict()
  config.dataset.name = 'fashion_mnist'
  config.dataset.data_dir = ml_collections.FieldReference(None, field_type=str)
  config.dataset.train_split = 'train'
  config.dataset.eval_split = 'test'
  # Square side the host decodes images to (None: the dataset's own fixed
  # size). 'image_folder' and ImageNet-like datasets need it.
  config.dataset.image_size = ml_collections.FieldReference(None,
                                                            field_type=int)
  # Hold the split in host memory (small datasets); False reads every batch
  # from the files, each process only its part (ImageNet on a pod).
  config.dataset.in_memory = True
  # Streamed sources: decode in this many worker processes; 0 decodes on a
  # thread pool in the training process; -1 chooses from the host (worker
  # processes, one per core, on an accelerator host; threads on the CPU
  # backend; logged at start: pipeline.decoding, docs/input_pipeline.md).
  config.dataset.num_workers = -1
  # Bad data (docs/input_pipeline.md): an image that does not decode is
  # replaced by a black one in training and left out of evaluation, named in
  # the log and counted in results.json; a split with more than this
  # fraction of such records stops the run, listing them.
  config.dataset.max_bad_fraction = 0.01
  # Decode every record of both splits before training (streamed splits;
  # an in-memory split is read whole anyway): every bad file is listed, and
  # the run refuses before its first step if there are too many.
  config.dataset.verify = False
  # A fixed, stratified holdout of the training split (0: none), removed from
  # the training data; its seed is fixed, independent of config.seed
  # (input_pipeline/splits.py). Choices are made on it; see config.eval.split.
  config.dataset.validation_size = 0
  # CACR's class-imbalanced training data (Table 2; docs/configs.md),
  # applied after the holdout: 'none', 'linear' (class level l of L =
  # min(classes, 10) keeps l / L of its examples) or 'exponential' (exp(l - L)).
  config.dataset.imbalance = 'none'
  # Where the training views' random resized crops are cut (streamed image
  # sources; docs/input_pipeline.md): 'center_square' takes them on the
  # devices from the image_size square the host made (`resize` below:
  # shorter side resized and centre cut, or squashed); 'full_image' cuts each view's crop on the host from the
  # full decoded image and resizes it to image_size, as torchvision's
  # RandomResizedCrop and SimCLR's distorted_bounding_box_crop do, so small
  # crops keep the image's resolution and reach the borders the square cuts
  # off. The rest of each view's ops stay on the devices.
  config.dataset.train_crop_source = 'center_square'
  # Evaluation images (the kNN bank and queries, the linear probe's eval
  # split): the shorter side resized to image_size / fraction and the central
  # image_size square cut. 1.0 keeps the whole square; 0.875 is
  # Resize(256) + CenterCrop(224) (MoCo, InsDis; SimCLR's CROP_PROPORTION).
  # Below 1 it needs a host resize: a streamed split with image_size set.
  config.dataset.eval_crop_fraction = 1.0
  # How the host makes each decoded image the image_size square that
  # evaluation reads (and 'center_square' training): 'shorter_side' resizes
  # the shorter side and cuts the centre (above); 'squash' resizes the whole
  # image to image_size x image_size, aspect ratio lost, as torchvision's
  # Resize((224, 224)) (TCL's ImageNet-100 code); it needs the fraction 1.
  config.dataset.resize = 'shorter_side'

  # Views: `preset` names a recipe in input_pipeline/augment.py PRESETS.
  config.augment = ml_collections.ConfigDict()
  config.augment.preset = 'fmnist'
  config.augment.num_views = 2
  # Per-view field overrides: one dict for all views or one per view, e.g.
  # ({'blur_p': 1.0}, {'blur_p': 0.1, 'solarize_p': 0.2}).
  config.augment.overrides = ()
  # The order of every view's ops (input_pipeline/augment.py OPS, crop
  # first); the flip commutes with the others, so what an order changes is
  # mainly grayscale against jitter: InsDis converts to grayscale first
  # ('crop, grayscale, jitter, flip'), SimCLR and MoCo jitter first.
  config.augment.op_order = ('crop, flip, autoaugment, jitter, grayscale, blur, '
                             'solarize')

  config.model = ml_collections.ConfigDict()
  config.model.encoder = 'small_cnn'
  # pool='none': evaluate the flattened last map (3x3x256); the head reads
  # its global average.
  config.model.encoder_kwargs = ml_collections.ConfigDict(
      {'widths': (32, 64, 128, 256), 'pool': 'none'})
  # What the head reads from the map: 'pooled' (its global average) or
  # 'features' (the flattened map that evaluation reads).
  config.model.head_input = 'pooled'
  # L2-normalise that input (each row) before the head: the SupCon authors'
  # TF code (--normalize_embedding). Evaluation reads the unnormalised
  # features either way.
  config.model.normalize_head_input = False
  config.model.head_hidden_dim = 512
  config.model.head_out_dim = 128
  config.model.head_layers = 2
  # Per-channel standardisation of the [0, 1] images, (x - mean) / std: the
  # model's first op (float32, before the compute-dtype cast), so training
  # and every evaluator see it. A name of models.py INPUT_NORMS, each a
  # reference code's transforms.Normalize statistics: 'imagenet' (torchvision
  # / MoCo / lightly), 'cifar10' and 'cifar100' (SupContrast, HCL,
  # lemniscate, TCL), 'cifar10_solo' and 'cifar100_solo' (solo-learn), 'half'
  # (TCL's ImageNet-100: 0.5 / 0.25), 'symmetric' ([-1, 1]: the SupCon
  # authors' TF code); 'none' feeds [0, 1] as is (SimCLR's TF code). The
  # statistics' channels must be the images' (3; 'none' for greyscale).
  config.model.input_norm = 'none'
  config.model.head_batch_norm = True       # False: MoCo v2's head (no BN).
  # > 0: every BatchNorm of the encoder normalises each view's global batch
  # in this many equal groups, each with its own statistics (contrastive_jax/
  # batch_norm.py): BN per device of the papers' multi-GPU runs (MoCo: 8 GPUs),
  # or lightly's one-GPU emulation of it (num_splits=8), on any number of
  # devices; with config.moco.shuffle_bn the key batch is shuffled over the
  # groups. batch_size must be a multiple. 0: statistics over the whole batch.
  config.model.bn_splits = 0
  # Every encoder BatchNorm with the ReLU and residual add after it as one op
  # with the textbook backward (contrastive_jax/batch_norm.py); False:
  # nn.BatchNorm, then the add and the ReLU, differentiated by autodiff. The
  # same values to float32 rounding; which is faster: docs/performance.md.
  config.model.fused_bn = True
  # A BatchNorm on the head's output, after its last (then bias-free) dense
  # layer: SimCLR's projection head (scale, no offset), lightly's
  # SimCLRProjectionHead (scale and offset), MoCo v3's projector (neither).
  # `_scale` / `_center` are its learned scale and offset. Projector only:
  # a predictor (config.moco.predictor_hidden_dim) never has one.
  config.model.head_final_bn = False
  config.model.head_final_bn_scale = True
  config.model.head_final_bn_center = True
  # The head's (and a predictor's) Dense initialisation (models.py
  # HEAD_INITS): 'lecun_normal' (Flax's default), 'torch_default'
  # (torch.nn.Linear's: kernel and bias U(+-1 / sqrt(fan_in))), 'normal_0.01'
  # (SimCLR's and SupCon's TF heads), 'glorot_uniform' (tf.layers.dense's).
  config.model.head_init = 'lecun_normal'
  # Compute dtype of the conv and dense layers: 'float32', or 'bfloat16' for
  # mixed precision (parameters, optimizer state, BN statistics, features and
  # the loss stay float32; models.py).
  config.model.dtype = 'float32'

  # A loss from contrastive_jax.losses.LOSSES and its keyword arguments.
  config.loss = 'ntxent'
  config.loss_kwargs = ml_collections.ConfigDict({'temperature': 0.1})
  # Loss keywords that change per step: keyword -> a kind from
  # contrastive_jax/schedules.py applied to its loss_kwargs value (or the
  # loss's default), e.g. {'lam': 'epoch_ramp'} (JCL).
  config.loss_schedules = ml_collections.ConfigDict()
  # A constant factor on the loss the step differentiates (and logs as
  # `loss`): reference code's own factors, e.g. MoCo v3's 4 tau (2 tau per
  # direction, both summed), SupContrast's tau / 0.07. With SGD it scales
  # the gradient's step (against the weight decay's); under LARS only the
  # steps of unadapted leaves and the decay's share of the trust ratio.
  config.loss_scale = 1.0

  # How a batch becomes the loss's inputs: a module of contrastive_jax/methods,
  # e.g. 'in_batch' (all views through the online encoder; SimCLR-style),
  # 'moco' (EMA key encoder, optional queue), 'memory_bank' (InsDis/CMC).
  config.method = 'in_batch'
  config.use_labels = False       # Pass batch labels to the loss (supcon, tcl).
  # Each method's section holds its own defaults (methods/<name>.py DEFAULTS).
  config.moco = ml_collections.ConfigDict(moco.DEFAULTS)
  config.memory_bank = ml_collections.ConfigDict(memory_bank.DEFAULTS)

  config.optimizer = ml_collections.ConfigDict()
  # adamw (decoupled decay), adam (torch's Adam: L2 added to the gradient),
  # sgd, lars.
  config.optimizer.name = 'adamw'
  # Peak lr = base_learning_rate * batch_size / 256 (linear scaling rule).
  config.optimizer.base_learning_rate = 1e-3
  config.optimizer.weight_decay = 1e-4
  config.optimizer.momentum = 0.9           # sgd and lars only.
  # False: weight decay (and LARS's trust-ratio adaptation) skip biases and
  # BatchNorm scales/offsets, the 1-D leaves (SimCLR, MoCo v3). True: every
  # parameter is decayed and adapted, as torch's SGD(model.parameters(),
  # weight_decay=...) of MoCo v1/v2, InsDis and SupContrast.
  config.optimizer.decay_biases_and_bn = False
  # LARS only: the trust coefficient (optax.lars's, solo-learn's eta) and
  # whether each layer's rate is capped at the global lr (solo-learn clip_lr).
  config.optimizer.trust_coefficient = 0.001
  config.optimizer.clip_lr = False
  config.optimizer.warmup_fraction = 0.05   # Of all steps.
  # The lr the linear warmup starts from (SupContrast: 0.01); 0: from 0.
  config.optimizer.warmup_init_lr = 0.
  # After the warmup: 'cosine' decay to cosine_final x the peak lr, or
  # 'step': x lr_decay at each of decay_epochs (InsDis, MoCo v1: x0.1 at
  # epochs 120 and 160 of 200).
  config.optimizer.schedule = 'cosine'
  # 'cosine' only: the last step's lr as a fraction of the peak, in [0, 1):
  # 0 decays to 0 (SimCLR, MoCo v2/v3, solo-learn, lightly); SupContrast
  # and TCL end at eta_min = lr x lr_decay_rate^3 = 1e-3 x lr. The cosine is
  # evaluated at every step (MoCo v2's and SupContrast's per epoch).
  config.optimizer.cosine_final = 0.
  config.optimizer.decay_epochs = ()
  config.optimizer.lr_decay = 0.1

  config.batch_size = 256                   # Instances; each gives num_views.
  config.num_epochs = 4.0

  config.log_every_steps = 20
  config.checkpoint_every_steps = 100

  # Online monitors during pretraining (labelled "online/" everywhere): a
  # linear head on stop-gradient backbone features, trained with the labels,
  # and a periodic weighted kNN on fixed subsets. Neither affects training.
  config.online = ml_collections.ConfigDict()
  # A linear classifier trained inside the step (Adam, lr 1e-3) on the batch's
  # stop-gradient features: its accuracy is a cheap monitor
  # ('online/linear_acc').
  config.online.classifier = True

  # What every evaluator of config.evals (below) shares: the split scored,
  # the feature batch, the baselines, the t-SNE maps.
  config.eval = ml_collections.ConfigDict()
  # What the final evaluators score: 'test' (config.dataset.eval_split) or
  # 'validation' (the holdout; needs config.dataset.validation_size > 0).
  # Recipe choices are made on 'validation'; 'test' is only reported.
  config.eval.split = 'test'
  config.eval.batch_size = 1024
  config.eval.baselines = True              # Also score raw pixels, random init.
  # Evaluation examples in summary.png's t-SNE maps (0: no maps).
  config.eval.embedding_points = 2000

  # The evaluators (contrastive_jax/evaluators): every_steps 0 runs one after
  # training on every representation, N > 0 every N steps on the current
  # encoder ('online/...'), -1 turns it off.
  config.evals = ml_collections.ConfigDict()
  config.evals.knn = dict(type='knn', every_steps=0, ks=(200,),
                          temperature=0.1, bank_size=0, num_queries=0)
  # l2 = 1e-5 ~ scikit-learn's LogisticRegression(C=1) on 60k examples;
  # preconditioned L-BFGS converges within 50 iterations on these features.
  config.evals.linear = dict(type='logreg', every_steps=0, l2=1e-5,
                             max_iter=50)
  config.evals.online_knn = dict(type='knn', every_steps=200, ks=(20,),
                                 temperature=0.1, bank_size=10000,
                                 num_queries=2000)
  # The papers' linear evaluation (SGD on augmented images through the frozen
  # encoder), off here; on with every_steps=0 and a preset of
  # contrastive_jax/evaluators/linear_eval.py (configs/papers set one).
  config.evals.linear_eval = dict(type='linear_eval', every_steps=-1,
                                  preset='', epochs=0, batch_size=0)
  return config
