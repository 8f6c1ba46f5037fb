"""A tiny DCGAN-style loop in the style of pytorch/examples' dcgan/main.py: a generator and a discriminator, two
optimizers, functional losses, the generator's loss backwarded through the discriminator. Prints six digits."""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())

    def forward(self, noise):
        return self.main(noise)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x):
        return self.main(x).view(-1)


netG, netD = Generator(), Discriminator()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
data = torch.randn(5, 8, 8) * 0.5 + 1.0

for i, real in enumerate(data):
    netD.zero_grad()
    label = torch.ones(real.size(0))
    errD_real = F.binary_cross_entropy_with_logits(netD(real), label)
    errD_real.backward()
    fake = netG(torch.randn(real.size(0), 4))
    errD_fake = F.binary_cross_entropy_with_logits(netD(fake.detach()), torch.zeros(real.size(0)))
    errD_fake.backward()
    errD = errD_real + errD_fake
    optimizerD.step()
    netG.zero_grad()
    errG = F.binary_cross_entropy_with_logits(netD(fake), label)
    errG.backward()
    optimizerG.step()
    print(f"[{i}] Loss_D: {errD.item():.6f} Loss_G: {errG.item():.6f}")
