"""A tiny word-level LSTM language model in the style of pytorch/examples' word_language_model/main.py: a corpus
written inline (no download), hand-written SGD updates or `--use-optimizer`, the model saved with `torch.save`
every epoch and loaded back for the test evaluation. Prints each batch's loss with six digits."""

import argparse
import math

import torch
import torch.nn as nn

TEXT = (
    "the cat sat on the mat . the dog sat on the log . a cat saw a dog . the dog saw the cat on the mat . "
    "a bird sat on the dog . the mat was on the log . a cat and a dog sat . the bird saw a log ."
)

parser = argparse.ArgumentParser(description="tiny word language model")
parser.add_argument("--lr", type=float, default=2.0)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--bptt", type=int, default=8)
parser.add_argument("--use-optimizer", action="store_true")
parser.add_argument("--save", type=str, default="model.pt")
args = parser.parse_args()
torch.manual_seed(0)


class Corpus:
    def __init__(self, text):
        words = text.split()
        self.vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
        ids = torch.tensor([self.vocab[w] for w in words])
        cut = len(ids) * 3 // 4
        self.train, self.test = ids[:cut], ids[cut:]


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.encoder(input), hidden)
        return self.decoder(output).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return weight.new_zeros(1, bsz, self.nhid), weight.new_zeros(1, bsz, self.nhid)


def repackage_hidden(h):
    return tuple(v.detach() for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


corpus = Corpus(TEXT)
train_data, test_data = batchify(corpus.train, 4), batchify(corpus.test, 2)
model = RNNModel(len(corpus.vocab), 8, 16)
criterion = nn.NLLLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr) if args.use_optimizer else None


def evaluate(source):
    model.eval()
    total, hidden = 0.0, model.init_hidden(source.size(1))
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, args.bptt):
            data, targets = get_batch(source, i)
            output, hidden = model(data, hidden)
            total += len(data) * criterion(torch.log_softmax(output, dim=1), targets).item()
    return total / (len(source) - 1)


def train(epoch):
    model.train()
    hidden = model.init_hidden(train_data.size(1))
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        hidden = repackage_hidden(hidden)
        if optimizer is None:
            model.zero_grad()
        else:
            optimizer.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(torch.log_softmax(output, dim=1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        if optimizer is None:
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-args.lr)
        else:
            optimizer.step()
        print(f"| epoch {epoch} | batch {batch} | loss {loss.item():.6f}")


for epoch in range(1, args.epochs + 1):
    train(epoch)
    print(f"| end of epoch {epoch} | valid ppl {math.exp(evaluate(test_data)):8.2f}")
    with open(args.save, "wb") as f:
        torch.save(model, f)
with open(args.save, "rb") as f:
    model = torch.load(f, weights_only=False)  # the file this script wrote just above
print(f"| end of training | test loss {evaluate(test_data):.4f}")
