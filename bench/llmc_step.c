// llm.c's CPU training step, timed: the step of train_gpt2.c's main() (forward, zero_grad,
// backward, AdamW update), on a weights file and a tokens file given on the command line, with
// nothing else (no validation, no sampling, no tokenizer). Built and run by
// bench/bench_train.py --llmc PATH, which passes a llm.c checkout as the include path:
//     gcc -Ofast -march=native -fopenmp -DOMP -I PATH bench/llmc_step.c -lm -o bench/build/llmc_step
//     llmc_step CHECKPOINT TOKENS WARMUP STEPS   ->  "step N: loss L took MS ms" per step
#define TESTING
#include "train_gpt2.c"

int main(int argc, char** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s CHECKPOINT TOKENS WARMUP STEPS\n", argv[0]);
        return 1;
    }
    GPT2 model;
    gpt2_build_from_checkpoint(&model, argv[1]);
    int B = 4;   // train_gpt2.c's main(): 4 sequences of 64 tokens
    int T = 64;
    DataLoader loader;
    dataloader_init(&loader, argv[2], B, T, 0, 1, 0);   // no shuffling: the batches in file order
    int n = atoi(argv[3]) + atoi(argv[4]);
    struct timespec start, end;
    for (int step = 0; step < n; step++) {
        clock_gettime(CLOCK_MONOTONIC, &start);
        dataloader_next_batch(&loader);
        gpt2_forward(&model, loader.inputs, loader.targets, B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, step + 1);
        clock_gettime(CLOCK_MONOTONIC, &end);
        double ms = (end.tv_sec - start.tv_sec) * 1e3 + (end.tv_nsec - start.tv_nsec) / 1e6;
        printf("step %d: loss %f took %f ms\n", step, model.mean_loss, ms);
        fflush(stdout);
    }
    dataloader_free(&loader);
    gpt2_free(&model);
    return 0;
}
